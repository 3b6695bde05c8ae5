"""Web server speed on a 1-million-event profile: cold and warm page JSON, timeline windows,
the hottest file's source view, a bounded load test of concurrent clients on 127.0.0.1, and a
restart on the same analysis cache (the summary and profile list read back from disk). Times are
wall clock, with the server process's CPU time beside the cold ones (steadier on a shared machine).

    .venv/bin/python benchmarks/web_bench.py [--events N] [--clients C] [--seconds S]

The profile is synthetic and neuron-shaped (benchmarks/web_synth.py), kept in benchmarks/data/.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from web_synth import make_profile  # noqa: E402


def _ms(f) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = f()
    r.raise_for_status()
    return (time.perf_counter() - t0) * 1e3, r


def _cpu_ms(proc: subprocess.Popen) -> float:
    """CPU time (user + system, all threads) the server process has used so far."""
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def _timed(proc: subprocess.Popen, f) -> tuple[str, httpx.Response]:
    """Wall and server CPU time of one request, as 'W ms (server CPU C ms)'."""
    cpu = _cpu_ms(proc)
    t, r = _ms(f)
    return f"{t:.0f} ms (server CPU {_cpu_ms(proc) - cpu:.0f} ms)", r


def _start_server(
    root: Path, cache: Path, max_memory: int | None = None, warm_up: bool = False
) -> tuple[subprocess.Popen, str]:
    """A server on `root` whose analysis cache lives under `cache` (XDG_CACHE_HOME), with a
    memory ceiling of `max_memory` bytes (None: the default); `warm_up`: run the warm-up in a
    thread, as `serve` does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import sys, uvicorn; from neuron_explorer.web.app import create_app; "
        f"app = create_app(sys.argv[1], max_memory={max_memory}); "
        + (
            "import threading; threading.Thread(target=app.state.warm_up, daemon=True).start(); "
            if warm_up
            else ""
        )  # fmt: skip
        + f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning')"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(root)], env=env)
    base = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # up to a minute: imports are slow on a loaded machine
        try:
            httpx.get(base + "/static/app.css", timeout=1)
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not start")


def _load(
    base: str, name: str, file_id: str, extent: tuple[int, int], clients: int, seconds: float
):
    """Each client loops over summary, a random timeline window and the source view."""
    span = extent[1] - extent[0]
    lat: dict[str, list[float]] = {"summary": [], "timeline": [], "source": []}
    errors = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(seed: int) -> None:
        rnd = random.Random(seed)
        with httpx.Client(base_url=base, timeout=30) as c:
            while time.monotonic() < stop:
                s = extent[0] + rnd.randrange(span)
                routes = {
                    "summary": f"/api/p/{name}",
                    "timeline": f"/api/p/{name}/timeline?start_ns={s}&end_ns={s + span // 50}&width_px=1500",
                    "source": f"/api/p/{name}/source/{file_id}",
                }
                for route, url in routes.items():
                    t0 = time.perf_counter()
                    try:
                        ok = c.get(url).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    with lock:
                        lat[route].append((time.perf_counter() - t0) * 1e3)
                        errors[0] += not ok

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return lat, errors[0], elapsed


FOREVER_SQL = "SELECT count(*) FROM events a, events b, events c WHERE a.id + b.id + c.id = -1"


def _search_and_memory(
    c: httpx.Client, name: str, extent: tuple[int, int]
) -> list[tuple[str, str]]:
    """The timeline's find (a substring, a regex) over every event, and the memory page."""
    rows = []
    for label, params in (("find by substring ('addmm')", {"q": "addmm"}),
                          ("find by regex ('^aten::(relu|softmax)$')", {"q": "^aten::(relu|softmax)$", "regex": "true"})):  # fmt: skip
        t, r = _ms(lambda params=params: c.get(f"/api/p/{name}/search", params=params))
        again = statistics.median(
            _ms(lambda params=params: c.get(f"/api/p/{name}/search", params=params))[0]
            for _ in range(5)
        )
        rows.append(
            (
                f"{label}: {r.json()['total']:,} matches, first / p50 of 5",
                f"{t:.0f} ms / {again:.0f} ms",
            )
        )
    t, r = _ms(lambda: c.get(f"/api/p/{name}/memory"))
    samples = sum(k["samples"] for k in r.json()["counters"])
    rows.append((f"memory page JSON, first ({samples:,} counter samples)", f"{t:.0f} ms"))
    span = extent[1] - extent[0]
    t, _ = _ms(lambda: c.get(f"/api/p/{name}/counters", params={"start_ns": extent[0] + span // 3,
                                                                "end_ns": extent[0] + span // 3 + span // 50, "width_px": 1500}))  # fmt: skip
    rows.append(("memory track of a timeline window (2% of the profile)", f"{t:.0f} ms"))
    return rows


def _sql_saturated(c: httpx.Client, base: str, name: str) -> list[tuple[str, str]]:
    """Pages and static files while 12 runaway queries flood the SQL route (2 run, 6 wait,
    the rest are refused at once)."""
    statuses: list[int] = []

    def runaway() -> None:
        try:
            statuses.append(
                httpx.get(
                    f"{base}/api/p/{name}/sql", params={"q": FOREVER_SQL}, timeout=120
                ).status_code
            )
        except httpx.HTTPError:
            statuses.append(0)

    threads = [threading.Thread(target=runaway) for _ in range(12)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    lat = {u: [_ms(lambda u=u: c.get(u))[0] for _ in range(5)]
           for u in ("/static/app.css", f"/p/{name}", f"/api/p/{name}")}  # fmt: skip
    refused = len(statuses)  # answered already: the 503s
    for t in threads:
        t.join()
    out = [
        (
            "SQL flood: 12 runaway queries at once",
            f"{refused} refused at once (503), {statuses.count(400)} stopped at 10 s",
        )
    ]
    for u, v in lat.items():
        out.append((f"  {u} during the flood, p50 of 5", f"{statistics.median(v):.0f} ms"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--windows", type=int, default=30, help="timeline windows to time")
    args = ap.parse_args()

    root = HERE / "data" / "web"
    prof = root / f"synth-{args.events}"
    if not prof.exists():
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        make_profile(prof, args.events)
        print(f"made {prof} in {time.perf_counter() - t0:.1f} s")
    shutil.rmtree(root / ".cache", ignore_errors=True)
    cache = Path(tempfile.mkdtemp(prefix="web-bench-cache-"))  # an empty analysis cache: cold
    name = prof.name
    proc, base = _start_server(prof, cache)
    rows: list[tuple[str, str]] = []
    try:
        with httpx.Client(base_url=base, timeout=120) as c:
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}/timeline?width_px=1500"))
            rows.append(("first load: open + timeline of the whole profile (cold)", t))
            extent = (r.json()["extent"]["start_ns"], r.json()["extent"]["end_ns"])
            events = r.json()["window"]["events"]
            t, _ = _timed(proc, lambda: c.get(f"/api/p/{name}"))
            rows.append(("summary JSON, cold (analysis summary + rules + ops + lines)", t))
            t, _ = _ms(lambda: c.get(f"/api/p/{name}/source"))
            rows.append(("source file list, after the summary", f"{t:.0f} ms"))
            warm = [_ms(lambda: c.get(f"/api/p/{name}"))[0] for _ in range(20)]
            rows.append(("summary JSON, warm, p50", f"{statistics.median(warm):.1f} ms"))
            rnd = random.Random(0)
            span = extent[1] - extent[0]
            win = []
            for _ in range(args.windows):
                w = span // rnd.choice((20, 50, 200, 1000))
                s = extent[0] + rnd.randrange(span - w)
                win.append(_ms(lambda s=s, w=w: c.get(
                    f"/api/p/{name}/timeline?start_ns={s}&end_ns={s + w}&width_px=1500"))[0])  # fmt: skip
            rows.append((f"timeline window (0.1-5% of the profile, 1500 px), p50 of {len(win)}",
                         f"{statistics.median(win):.1f} ms (p95 {sorted(win)[int(len(win) * .95)]:.0f})"))  # fmt: skip
            files = c.get(f"/api/p/{name}/source").json()["files"]
            fid = files[0]["file_id"]
            t, _ = _ms(lambda: c.get(f"/api/p/{name}/source/{fid}"))
            src = [_ms(lambda: c.get(f"/api/p/{name}/source/{fid}"))[0] for _ in range(20)]
            rows.append(("hottest file source view, first / warm p50",
                         f"{t:.1f} ms / {statistics.median(src):.1f} ms"))  # fmt: skip
            rows.extend(_search_and_memory(c, name, extent))
            rows.extend(_sql_saturated(c, base, name))
        lat, errors, elapsed = _load(base, name, fid, extent, args.clients, args.seconds)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    # a restart on the same analysis cache: the summary and the list come from disk
    proc, base = _start_server(prof, cache)
    try:
        with httpx.Client(base_url=base, timeout=120) as c:
            t, _ = _timed(proc, lambda: c.get("/api/profiles"))
            rows.append(("after a restart: profile list, first request", t))
            t, _ = _timed(proc, lambda: c.get(f"/api/p/{name}"))
            rows.append(("after a restart: summary JSON, first request (disk cache)", t))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(cache, ignore_errors=True)
    # a first visit to the list with nothing cached: it must not wait for the rules
    proc, base = _start_server(prof, cache)
    try:
        with httpx.Client(base_url=base, timeout=120) as c:
            t, _ = _timed(proc, lambda: c.get("/api/profiles"))
            rows.append(("profile list, first request, empty cache (analysis goes on behind)", t))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(cache, ignore_errors=True)
    n = sum(len(v) for v in lat.values())
    rows.append((f"load test: {args.clients} clients, {args.seconds:g} s",
                 f"{n / elapsed:.1f} req/s, {errors} errors"))  # fmt: skip
    for route, v in lat.items():
        if v:
            rows.append((f"  {route} under load, p50 / p95",
                         f"{statistics.median(v):.0f} / {sorted(v)[int(len(v) * .95)]:.0f} ms"))  # fmt: skip
    print(f"\nprofile: {events:,} events ({prof})\n")
    print("| measure | result |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

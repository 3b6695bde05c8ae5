"""The web server under load and faults: concurrent clients on 127.0.0.1 for a fixed time on the
summary, timeline, source and SQL routes, while clients drop connections mid-response and a SQL
query tries to run forever. Reports requests per second, latency and errors.

    .venv/bin/python benchmarks/load_bench.py [--events N] [--clients C] [--seconds S]

tests/test_reliability_server.py runs the same load for a few seconds; `serve` and `run_load`
are shared with it. The profile is synthetic and neuron-shaped (web_synth.py).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
FOREVER_SQL = "SELECT count(*) FROM events a, events b, events c WHERE a.id + b.id + c.id = -1"


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """`neuron-explorer serve ROOT --port 0` (real uvicorn on a free 127.0.0.1 port) in a process
    of its own; yields the base URL and stops the server on exit."""
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "serve", str(root), "--port", "0"],
                            cwd=HERE.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if " at http://" not in line:
            raise RuntimeError(
                f"serve did not start: {line}{proc.stderr.read() if proc.stderr else ''}"
            )
        url = line.split(" at ")[1].split()[0]
        yield url.split("/p/")[0].rstrip("/")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class LoadResult:
    """What the clients saw: requests done, errors (status >= 400 or a failed request), and
    latencies in ms by route kind."""

    seconds: float
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    latency_ms: dict[str, list[float]] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    def lines(self) -> list[str]:
        out = [f"{self.requests} requests in {self.seconds:.1f} s = {self.per_second:.0f}/s, "
               f"{len(self.errors)} errors"]  # fmt: skip
        for kind, ms in sorted(self.latency_ms.items()):
            q = statistics.quantiles(ms, n=100) if len(ms) > 1 else ms * 99
            out.append(f"  {kind:9} n={len(ms):5}  p50 {q[49]:7.1f} ms  p99 {q[98]:7.1f} ms")
        return out


def route_mix(client: httpx.Client, base: str, name: str) -> list[tuple[str, str]]:
    """(kind, url) pairs to pick from: summary, timeline windows, source file and lines, SQL."""
    s = client.get(f"{base}/api/p/{name}", timeout=120).json()
    t = client.get(f"{base}/api/p/{name}/timeline", timeout=120).json()
    src = client.get(f"{base}/api/p/{name}/source", timeout=120).json()
    lo, hi = t["extent"]["start_ns"], t["extent"]["end_ns"]
    rng = random.Random(name)
    urls = [("summary", f"{base}/api/p/{name}"), ("page", f"{base}/p/{name}")]
    for _ in range(8):
        a = rng.randint(lo, hi)
        urls.append(("timeline", f"{base}/api/p/{name}/timeline?start_ns={a}"
                                 f"&end_ns={a + rng.randint(1, max(1, hi - lo))}&width_px=1200"))  # fmt: skip
    urls.append(("source", f"{base}/api/p/{name}/source"))
    for f in src["files"][:3]:
        urls.append(("source", f"{base}/api/p/{name}/source/{f['file_id']}"))
    for line in s["top_lines"][:3]:
        urls.append(
            ("source", f"{base}/api/p/{name}/source/{line['file_id']}/lines/{line['line']}")
        )
    for q in ("SELECT kind, count(*) AS n, sum(dur_ns) FROM events GROUP BY kind",
              "SELECT name, dur_ns FROM events ORDER BY dur_ns DESC LIMIT 20"):  # fmt: skip
        urls.append(("sql", f"{base}/api/p/{name}/sql?q={q}"))
    return urls


def run_load(
    base: str, names: list[str], clients: int, seconds: float, seed: int = 0
) -> LoadResult:
    """`clients` threads, each with its own connection, request random routes for `seconds`."""
    with httpx.Client() as c:
        urls = [u for n in names for u in route_mix(c, base, n)]
    result = LoadResult(seconds)
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        with httpx.Client(timeout=60) as c:
            while time.monotonic() < stop:
                kind, url = rng.choice(urls)
                t0 = time.perf_counter()
                try:
                    r = c.get(url)
                    err = f"{r.status_code} {url}: {r.text[:200]}" if r.status_code >= 400 else None
                except httpx.HTTPError as e:
                    err = f"{e.__class__.__name__} {url}"
                ms = (time.perf_counter() - t0) * 1e3
                with lock:
                    result.requests += 1
                    result.latency_ms.setdefault(kind, []).append(ms)
                    if err:
                        result.errors.append(err)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return result


def drop_mid_response(base: str, path: str, times: int) -> int:
    """Ask for a large response and reset the connection after its first bytes; returns how
    many were cut off before the end."""
    host, port = base.removeprefix("http://").split(":")
    cut = 0
    for _ in range(times):
        s = socket.create_connection((host, int(port)))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        got = s.recv(4096)
        cut += bool(got)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()  # linger 0: a reset, as a closed browser tab does
    return cut


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--no-faults", action="store_true", help="load only: no runaway SQL, no drops")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from web_synth import make_profile

    root = Path(tempfile.mkdtemp(prefix="load-bench-"))
    make_profile(root / "neuron", args.events)
    with serve(root) as base:
        forever: dict[str, object] = {}

        def runaway() -> None:
            t0 = time.perf_counter()
            r = httpx.get(f"{base}/api/p/neuron/sql", params={"q": FOREVER_SQL}, timeout=120)
            forever.update(
                status=r.status_code, s=time.perf_counter() - t0, error=r.json().get("error")
            )

        stuck = threading.Thread(target=runaway if not args.no_faults else lambda: None)
        stuck.start()
        dropper = threading.Thread(
            target=lambda: forever.update(
                drops=drop_mid_response(base, "/static/plotly.min.js", 0 if args.no_faults else 200)
            )
        )
        dropper.start()
        res = run_load(base, ["neuron"], args.clients, args.seconds)
        stuck.join()
        dropper.join()
        after = httpx.get(f"{base}/api/p/neuron", timeout=60).status_code
    print(f"load: {args.clients} clients, {args.events} events, {args.seconds:g} s")
    print("\n".join(res.lines()))
    print(
        f"runaway SQL: {forever.get('status')} after {forever.get('s', 0):.1f} s ({forever.get('error')})"
    )
    print(f"dropped mid-response: {forever.get('drops')}; summary afterwards: {after}")
    for e in res.errors[:5]:
        print("error:", e)


if __name__ == "__main__":
    main()

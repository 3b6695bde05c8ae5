"""The web UI on the profile of a 1 GB Kineto trace (issue 17, "Large profiles"): the import,
then against a fresh server with an empty analysis cache: the first page (summary JSON) and the
timeline's first view, timeline windows, find, the memory track, the call tree, a source line's
events. Times are wall clock, with the server's CPU time beside the cold ones.

    .venv/bin/python benchmarks/web_big_bench.py [--mb 1000] [--windows 30]
    .venv/bin/python benchmarks/web_big_bench.py --profile DIR --max-memory 600M

With --max-memory, a ceiling below the profile's whole need (issue 31): the timeline's first
view (index streamed, whole view reduced in batches), windows, find and SQL, with the server's
peak RSS (VmHWM) after each step.

The trace is written by benchmarks/big_trace.py into benchmarks/data/ (ignored by git) and
imported there once; delete benchmarks/data/cuda_<MB>mb* to start again.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from big_trace import write  # noqa: E402
from web_bench import _cpu_ms, _ms, _start_server, _timed  # noqa: E402


def _prepare(mb: int) -> tuple[Path, list[tuple[str, str]]]:
    rows = []
    trace = HERE / "data" / f"cuda_{mb}mb.pt.trace.json"
    prof = HERE / "data" / f"cuda_{mb}mb"
    if not trace.exists() and not (prof / "manifest.json").exists():  # the profile is enough
        events, s = write(trace, mb)
        rows.append(
            (
                "trace written (big_trace.py)",
                f"{trace.stat().st_size / 1e6:.0f} MB, {events:,} JSON events, {s:.0f} s",
            )
        )
    if not (prof / "manifest.json").exists():
        shutil.rmtree(prof, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "neuron_explorer", "import", str(trace), "-o", str(prof)],
            check=True,
        )
        rows.append(("import (neuron-explorer import)", f"{time.perf_counter() - t0:.1f} s"))
    from neuron_explorer.analysis import stored
    from neuron_explorer.model import Profile

    if stored.load(Profile.open(prof), "summary") is None:  # imported before, or code edited
        t0, c0 = time.perf_counter(), time.process_time()
        stored.write(Profile.open(prof))
        rows.append(("the import's stored analysis (analysis/stored.py), added",
                     f"{time.perf_counter() - t0:.1f} s (CPU {time.process_time() - c0:.1f} s)"))  # fmt: skip
    return prof, rows


def _first_page_ab(prof: Path, rounds: int) -> None:
    """The cold first page with and without the analysis the import stores, alternated: two
    copies of the profile (hard links), one without its analysis/ folder, each served by a
    fresh server with an empty cache."""
    base = Path(tempfile.mkdtemp(prefix="web-big-ab-"))
    for label in ("stored", "computed"):
        (base / label / prof.name).mkdir(parents=True)
        for f in prof.iterdir():
            if f.is_file():
                (base / label / prof.name / f.name).hardlink_to(f)
    shutil.copytree(prof / "analysis", base / "stored" / prof.name / "analysis")
    try:
        for i in range(rounds):
            for label in ("computed", "stored") if i % 2 else ("stored", "computed"):
                cache = Path(tempfile.mkdtemp(prefix="web-big-cache-"))
                proc, url = _start_server(base / label / prof.name, cache)
                try:
                    with httpx.Client(base_url=url, timeout=600) as c:
                        t, r = _timed(proc, lambda: c.get(f"/api/p/{prof.name}"))
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
                    shutil.rmtree(cache, ignore_errors=True)
                load = Path("/proc/loadavg").read_text().split()[0]
                print(f"round {i + 1}, {label}: first page {t}, {len(r.content) / 1e6:.1f} MB, "
                      f"load {load}", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _windows(c: httpx.Client, name: str, extent: tuple[int, int], n: int,
             only: bool = True) -> list[float]:  # fmt: skip
    """n windows of 0.1-5% of the profile (seed 0), asked as the page asks at a zoom or pan
    (`window_only=true`: the window without the lanes and steps it has), or, with `only`
    False, as the whole document (with the steps: 8.5 MB on the 10 GB trace's profile)."""
    rnd = random.Random(0)
    span = extent[1] - extent[0]
    out = []
    for _ in range(n):
        width = int(span * rnd.uniform(0.001, 0.05))
        s = extent[0] + rnd.randrange(max(1, span - width))
        url = f"/api/p/{name}/timeline?start_ns={s}&end_ns={s + width}&width_px=1500"
        url += "&window_only=true" if only else ""
        out.append(_ms(lambda url=url: c.get(url))[0])
    return out


def _window_rows(c: httpx.Client, proc: subprocess.Popen, name: str, ext: dict[str, int],
                 n: int, label: str) -> list[tuple[str, str]]:  # fmt: skip
    """The same n windows asked as the page asks (window only), then as whole documents: p50,
    p95 and the server's CPU a window."""
    rows = []
    for only, how in ((True, "as the page asks (window_only)"), (False, "whole documents")):
        cpu = _cpu_ms(proc)
        lat = _windows(c, name, (ext["start_ns"], ext["end_ns"]), n, only)
        cpu = (_cpu_ms(proc) - cpu) / n
        q = statistics.quantiles(lat, n=20)
        load = Path("/proc/loadavg").read_text().split()[0]
        rows.append((f"timeline window (0.1-5% of the profile, 1500 px) {label}, {how}, p50 of "
                     f"{n}", f"{statistics.median(lat):.0f} ms (p95 {q[18]:.0f}; server CPU "
                     f"{cpu:.0f} ms a window; load {load}); {_vm(proc)}"))  # fmt: skip
    return rows


def _vm(proc: subprocess.Popen) -> str:
    """The server's resident memory now and its peak (/proc/PID/status), in MB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
    )
    rss, hwm = (int(fields[k].split()[0]) >> 10 for k in ("VmRSS", "VmHWM"))
    return f"RSS {rss:,} MB, peak {hwm:,} MB"


def _status(c: httpx.Client, url: str, **kw) -> str:
    """One request's status and, if refused, the first words of why."""
    t0 = time.perf_counter()
    r = c.get(url, **kw)
    ms = (time.perf_counter() - t0) * 1e3
    why = "" if r.status_code == 200 else f": {r.json().get('error', '')[:90]}"
    return f"{r.status_code} in {ms:.0f} ms{why}"


def _under_ceiling(prof: Path, max_memory: str, n_windows: int) -> list[tuple[str, str]]:
    """The timeline, windows, find and SQL of `prof` under a ceiling below its whole need."""
    from neuron_explorer.web.memory import parse_size

    cache = Path(tempfile.mkdtemp(prefix="web-big-cache-"))
    name = prof.name
    proc, base = _start_server(prof, cache, parse_size(max_memory))
    rows = [("server started", _vm(proc))]
    try:
        with httpx.Client(base_url=base, timeout=600) as c:
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}"))  # the first page, first
            scope = (r.json().get("scope") or {}).get("line", "the whole profile")
            rows.append((f"summary page, cold, first request ({r.status_code}; {scope[:60]}...)",
                         f"{t}; {_vm(proc)}"))  # fmt: skip
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}/timeline?width_px=1500"))
            ext = r.json()["extent"]
            win = r.json()["window"]
            rows.append((f"timeline, first view, cold (index streamed, {win['events']:,} events "
                         f"in batches, {win['rects_count']} rects)", f"{t}; {_vm(proc)}"))  # fmt: skip
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}/timeline?width_px=1500"))
            rows.append(("timeline, first view, again (kept)", t))
            rows += _window_rows(c, proc, name, ext, n_windows, "read from the events")
            for label, params in (("find 'addmm' (substring)", {"q": "addmm"}),
                                  ("find /^aten::(relu|add_)$/ (regex)", {"q": "^aten::(relu|add_)$", "regex": "true"})):  # fmt: skip
                t, r = _timed(proc, lambda p=params: c.get(f"/api/p/{name}/search", params=p))
                again = statistics.median(
                    _ms(lambda p=params: c.get(f"/api/p/{name}/search", params=p))[0]
                    for _ in range(3)
                )
                rows.append((f"{label}: {r.json()['total']:,} matches, first / p50 of 3",
                             f"{t} / {again:.0f} ms; {_vm(proc)}"))  # fmt: skip
            sql = "SELECT name, count(*) AS n, sum(dur_ns) AS t FROM events GROUP BY 1 ORDER BY 3 DESC"
            rows.append(("SQL: time by name over every event",
                         _status(c, f"/api/p/{name}/sql", params={"q": sql})))  # fmt: skip
            rows.append(("summary page, again", _status(c, f"/api/p/{name}")))
            rows.append(("findings page", _status(c, f"/api/p/{name}/findings")))
            rows.append(("operators page", _status(c, f"/api/p/{name}/operators")))
            rows.append(("server at the end", _vm(proc)))
        proc.terminate()
        proc.wait(timeout=30)
        # the same disk cache; its warm-up (as `serve` runs it) builds the timeline's pyramid
        proc, base = _start_server(prof, cache, parse_size(max_memory), warm_up=True)
        with httpx.Client(base_url=base, timeout=600) as c:
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}/timeline?width_px=1500"))
            rows.append(("a restarted server's first view (index and view from the disk cache)",
                         f"{t}; {_vm(proc)}"))  # fmt: skip
            rows += _pyramid(c, proc, cache, name, ext, n_windows)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(cache, ignore_errors=True)
    return rows


def _pyramid(c: httpx.Client, proc: subprocess.Popen, cache: Path, name: str,
             ext: dict[str, int], n_windows: int) -> list[tuple[str, str]]:  # fmt: skip
    """The level-of-detail pyramid the warm-up builds (analysis/timeline_lod.py): its build
    (wall, the server's CPU, its peak, its size on disk), then the same windows from it."""
    t0, cpu0 = time.perf_counter(), _cpu_ms(proc)
    while not list(cache.rglob("timeline_lod_table.arrow")):  # written once built
        if proc.poll() is not None or time.perf_counter() - t0 > 1200:
            return [("timeline pyramid", "not built (server gone, or over 20 minutes)")]
        time.sleep(0.5)
    wall, cpu = time.perf_counter() - t0, (_cpu_ms(proc) - cpu0) / 1e3
    size = sum(f.stat().st_size for f in cache.rglob("timeline_lod_*"))
    rows = [("timeline pyramid built by the warm-up (after the cached summary, findings, index, "
             "names)", f"{wall:.0f} s wall, server CPU {cpu:.0f} s, {size / 1e6:.0f} MB on disk; "
             f"{_vm(proc)}")]  # fmt: skip
    time.sleep(2)  # the warm-up's last step done: the pyramid is in memory
    return rows + _window_rows(c, proc, name, ext, n_windows, "with the pyramid")


# each in a child process of its own (its peak RSS its own): the in-memory path, then the one a
# server over its ceiling takes (analysis/timeline_stream.py, timeline_batches.py, search_stream.py)
_PATHS = {
    "index, in memory (build_index)":
        "from neuron_explorer.analysis.timeline import build_index as b; x = b(p)",
    "index, streamed (build_index_streamed)":
        "from neuron_explorer.analysis.timeline_stream import build_index_streamed as b; x = b(p)",
    "whole view 1500 px, in memory (per-event arrays)":
        "from neuron_explorer.analysis.timeline import build_index, first_view, window; "
        "i = build_index(p); t0, c0 = clock(); x = window(p, i, *first_view(i), 1500)",
    "whole view 1500 px, in batches":
        "from neuron_explorer.analysis.timeline import first_view, window; "
        "from neuron_explorer.analysis.timeline_stream import build_index_streamed as b; "
        "i = b(p); t0, c0 = clock(); x = window(p, i, *first_view(i), 1500, batched=True)",
    "find 'addmm', from the Parquet dictionary (search)":
        "from neuron_explorer.analysis.search import search; x = search(p, 'addmm')",
    "find 'addmm', name counts then a row group at a time":
        "from neuron_explorer.analysis.search_stream import name_counts, search_bounded; "
        "x = search_bounded(p, name_counts(p), 'addmm')",
    "find 'addmm', name counts known (a row group at a time)":
        "from neuron_explorer.analysis.search_stream import name_counts, search_bounded; "
        "n = name_counts(p); t0, c0 = clock(); x = search_bounded(p, n, 'addmm')",
}  # fmt: skip


def _paths(prof: Path) -> list[tuple[str, str]]:
    """Each of _PATHS in a fresh process: wall and CPU time, peak RSS over the opened profile."""
    rows = []
    for label, code in _PATHS.items():
        script = (
            "import resource, time\n"
            "from neuron_explorer.model import Profile\n"
            "clock = lambda: (time.perf_counter(), time.process_time())\n"
            "peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10\n"
            f"p = Profile.open({str(prof)!r}); base = peak(); t0, c0 = clock()\n"
            f"{code}\n"
            "t, c = clock()\n"
            "print(f'{(t - t0) * 1e3:.0f} ms (CPU {(c - c0) * 1e3:.0f} ms), peak RSS "
            "{peak():,} MB ({peak() - base:+,} MB over the opened profile)')\n"
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True, cwd=Path.cwd())  # fmt: skip
        rows.append((label, out.stdout.strip()))
        print(f"{label}: {rows[-1][1]}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--windows", type=int, default=30)
    ap.add_argument("--first-page-ab", type=int, default=0, metavar="ROUNDS",
                    help="only the cold first page, with and without the stored analysis")  # fmt: skip
    ap.add_argument("--profile", type=Path, help="an imported profile (instead of --mb's)")
    ap.add_argument("--max-memory", help="the server's ceiling, below the profile's whole need")
    ap.add_argument("--paths", action="store_true",
                    help="only the timeline's and find's in-memory and out-of-core paths, in process")  # fmt: skip
    args = ap.parse_args()
    prof, rows = (args.profile, []) if args.profile else _prepare(args.mb)
    if args.paths:
        rows += _paths(prof)
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"| path ({prof.name}) | result |   (load average {' '.join(load)})\n|---|---|")
        for k, v in rows:
            print(f"| {k} | {v} |")
        return 0
    if args.max_memory:
        rows += _under_ceiling(prof, args.max_memory, args.windows)
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"| measure (--max-memory {args.max_memory}) | result |   (load average "
              f"{' '.join(load)})\n|---|---|")  # fmt: skip
        for k, v in rows:
            print(f"| {k} | {v} |")
        return 0
    if args.first_page_ab:
        for k, v in rows:
            print(f"{k}: {v}")
        _first_page_ab(prof, args.first_page_ab)
        return 0
    cache = Path(tempfile.mkdtemp(prefix="web-big-cache-"))
    name = prof.name
    proc, base = _start_server(prof, cache)  # serving one profile: it is named by its folder
    try:
        with httpx.Client(base_url=base, timeout=600) as c:
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}"))
            events = r.json()["manifest"]["row_counts"]["events"]
            pending = " (findings pending)" if r.json().get("analysis_pending") else ""
            rows.append((f"first page: summary JSON, cold ({events:,} events){pending}", t))
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}/findings"))
            found = len(r.json()["findings"])
            rows.append((f"findings twin after it (the rules, {found} findings)", t))
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}/timeline?width_px=1500"))
            ext = r.json()["extent"]
            rows.append(("timeline, first view (whole profile, cold: index built)", t))
            lat = _windows(c, name, (ext["start_ns"], ext["end_ns"]), args.windows, only=False)
            q = statistics.quantiles(lat, n=20)
            rows.append((f"timeline window (0.1-5% of the profile, 1500 px), p50 of {args.windows}",
                         f"{statistics.median(lat):.0f} ms (p95 {q[18]:.0f})"))  # fmt: skip
            for label, params in (("find 'addmm' (substring)", {"q": "addmm"}),
                                  ("find /^aten::(relu|add_)$/ (regex)", {"q": "^aten::(relu|add_)$", "regex": "true"})):  # fmt: skip
                t, r = _timed(proc, lambda p=params: c.get(f"/api/p/{name}/search", params=p))
                again = statistics.median(
                    _ms(lambda p=params: c.get(f"/api/p/{name}/search", params=p))[0]
                    for _ in range(3)
                )
                rows.append(
                    (
                        f"{label}: {r.json()['total']:,} matches, first / p50 of 3",
                        f"{t} / {again:.0f} ms",
                    )
                )
            span = ext["end_ns"] - ext["start_ns"]
            s = ext["start_ns"] + span // 3
            t, r = _timed(
                proc,
                lambda: c.get(
                    f"/api/p/{name}/counters",
                    params={"start_ns": s, "end_ns": s + span // 50, "width_px": 1500},
                ),
            )
            drawn = sum(len(k["ts_ns"]) for k in r.json()["counters"])
            rows.append((f"memory track of a 2% window ({drawn} buckets drawn)", t))
            t, r = _timed(
                proc,
                lambda: c.get(
                    f"/api/p/{name}/counters",
                    params={"start_ns": ext["start_ns"], "end_ns": ext["end_ns"], "width_px": 1500},
                ),
            )
            rows.append(("memory track of the whole profile", t))
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}/calltree"))
            rows.append((f"call tree, cold ({len(r.json()['nodes'])} nodes)", t))
            rows.append(
                ("call tree, warm", f"{_ms(lambda: c.get(f'/api/p/{name}/calltree'))[0]:.0f} ms")
            )
            t, r = _timed(proc, lambda: c.get(f"/api/p/{name}/operators"))
            rows.append(("operators page JSON, first", t))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(cache, ignore_errors=True)
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"| measure | result |   (load average {' '.join(load)})\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Import speed and peak memory against a bare json.load / orjson.loads of the same trace.

    .venv/bin/python benchmarks/import_bench.py            # records missing traces, then measures
    .venv/bin/python benchmarks/import_bench.py --mb 10 100 500 --repeat 3

Each measurement runs in a fresh subprocess: wall time, CPU time (user+sys) and peak RSS of the
work, next to the RSS the interpreter had before it (imports done), so the table shows both the
absolute peak and what the work itself added. Traces: benchmarks/data/ (import_record.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# One child per measurement; it prints one JSON line.
CHILD = r"""
import json, resource, shutil, sys, time
method, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
if method == "json":
    import json as lib; load = lambda: lib.loads(open(path, "rb").read())
elif method == "orjson":
    import orjson as lib; load = lambda: lib.loads(open(path, "rb").read())
elif method == "hta":
    from hta.trace_analysis import TraceAnalysis
    import os, shutil as sh
    d = out + "-hta"; os.makedirs(d); sh.copy(path, d)
    load = lambda: TraceAnalysis(trace_dir=d)
else:
    from explorer.importers import import_traces
    import explorer.importers.run, pyarrow.parquet, pyarrow.dataset  # libraries count as base
    load = lambda: import_traces([path], out)
def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
base = rss_mb()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
result = load()
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({"wall": t1 - t0, "cpu": cpu, "peak": peak, "base": base}))
"""

METHODS = ("json", "orjson", "import")


def measure(method: str, trace: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, method, str(trace), str(Path(tmp) / "profile")],
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(trace: Path, repeat: int, methods: tuple[str, ...]) -> dict[str, dict]:
    """Best (lowest wall) of `repeat` runs per method, the methods interleaved."""
    best: dict[str, dict] = {}
    for _ in range(repeat):
        for m in methods:
            r = measure(m, trace)
            if m not in best or r["wall"] < best[m]["wall"]:
                best[m] = r
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hta", action="store_true", help="also time HTA's TraceAnalysis")
    args = parser.parse_args()
    from import_record import DATA, record_size

    methods = METHODS + (("hta",) if args.hta else ())
    print(
        "| trace | MB | events | method | wall s | CPU s | peak RSS MB | added MB | added / JSON |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mb in args.mb:
        trace = DATA / f"transformer_{mb}mb.pt.trace.json"
        if not trace.exists():
            record_size(mb)
        size = trace.stat().st_size / 1e6
        with trace.open("rb") as f:
            events = f.read().count(b'"ph":')
        for m, r in bench(trace, args.repeat, methods).items():
            added = r["peak"] - r["base"]
            print(
                f"| {trace.name} | {size:.0f} | {events} | {m} | {r['wall']:.2f} | "
                f"{r['cpu']:.2f} | {r['peak']:.0f} | {added:.0f} | {added / size:.2f}x |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

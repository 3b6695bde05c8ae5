"""Import speed and peak memory against a bare json.load / orjson.loads of the same trace.

    .venv/bin/python benchmarks/import_bench.py            # records missing traces, then measures
    .venv/bin/python benchmarks/import_bench.py --mb 10 100 500 --repeat 3
    .venv/bin/python benchmarks/import_bench.py --cuda --mb 100 --methods orjson import stream
    .venv/bin/python benchmarks/import_bench.py --cuda --mb 1000 --repeat 1 --methods stream
    .venv/bin/python benchmarks/import_bench.py --cuda --mb 1000 --repeat 1 --methods chunked
    .venv/bin/python benchmarks/import_bench.py --cuda --mb 100 --methods chunked --chunked-mb 32
    .venv/bin/python benchmarks/import_bench.py --ranks 64 --mb 16 --repeat 1 --methods stream

`import` is the in-memory import (`memory_budget=None`: the file decoded in several processes),
`stream` the streaming import the CLI runs (`--memory-budget 2G`: read forward once in ranges,
args spilled to disk), `chunked` the streaming import with a budget the trace's mapping does
not fit (256 MB: from about 430 MB of JSON up, the trace mapped a chunk of time at a time and
merged, kineto_chunked). `--cuda`: big_trace.py's synthetic CUDA training trace (written when
missing) instead of the recorded transformer traces. `--ranks N`: a job of N rank files of the
CUDA trace, each of the size given (big_trace.write_ranks), imported as one profile.

Each measurement runs in a fresh subprocess: wall time, CPU time (user+sys, worker processes
included) and peak RSS of the work (the largest process), next to the RSS the interpreter had
before it (imports done), so the table shows both the absolute peak and what the work added.
"tree peak" is the memory of the whole process tree, sampled every 10 ms from outside: the
anonymous and file-backed RSS of the process and all its children plus the memfd files they
hold (the importer's decoding processes hand their columns over in one), each counted once.
Traces: benchmarks/data/ (import_record.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# One child per measurement; it prints one JSON line.
CHILD = r"""
import json, resource, shutil, sys, time
method, path, out, budget = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
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
    from neuron_explorer.importers import arrow_on_system_allocator, import_traces
    arrow_on_system_allocator()  # as `neuron-explorer import` does, before the libraries load
    import neuron_explorer.importers.run  # the libraries the import loads count as base
    budget = budget if method in ("stream", "chunked") else None
    load = lambda: import_traces([path], out, memory_budget=budget)
def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
base = rss_mb()
def cpu_s():  # this process and its worker processes (HTA parses in a multiprocessing pool)
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
c0, t0 = cpu_s(), time.perf_counter()
result = load()
t1, cpu = time.perf_counter(), cpu_s() - c0
peak = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
print(json.dumps({"wall": t1 - t0, "cpu": cpu, "peak": peak, "base": base}))
"""

METHODS = ("json", "orjson", "import", "stream", "chunked")
CHUNKED_MB = 256  # the chunked method's budget: under the 1 GB trace's mapping (600 MB)


def tree_mb(root: int) -> float:
    """Memory of `root` and all its descendants: anonymous and file-backed RSS of each, plus
    the memfd files they hold (counted once: a parent and child share them)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(x) for x in f.read().split()]
        except OSError:
            pass
    kb, memfds = 0, {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                kb += sum(int(x.split()[1]) for x in f if x.startswith(("RssAnon:", "RssFile:")))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = f"/proc/{pid}/fd/{fd}"
                if os.readlink(link).startswith("/memfd:"):
                    st = os.stat(link)
                    memfds[st.st_ino] = st.st_blocks * 512
        except OSError:
            pass
    return kb / 1024 + sum(memfds.values()) / 2**20


def measure(
    method: str, trace: Path, python: str = sys.executable, chunked_mb: int = CHUNKED_MB
) -> dict:
    """One run in a fresh process; its process tree's memory sampled from here every 10 ms
    (a sampling thread inside would contend for the measured interpreter's GIL)."""
    with tempfile.TemporaryDirectory() as tmp:
        budget = str((chunked_mb << 20) if method == "chunked" else 2 << 30)
        cmd = [python, "-c", CHILD, method, str(trace), str(Path(tmp) / "profile"), budget]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tree = 0.0
        while proc.poll() is None:
            tree = max(tree, tree_mb(proc.pid))
            time.sleep(0.01)
        out, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{method} failed: {err}")
    result = json.loads(out.strip().splitlines()[-1])
    result["tree"] = max(tree, result["peak"])
    return result


def bench(
    trace: Path,
    repeat: int,
    methods: tuple[str, ...],
    hta_python: str | None,
    chunked_mb: int = CHUNKED_MB,
) -> dict[str, dict]:
    """Best (lowest wall) of `repeat` runs per method, the methods interleaved (HTA once)."""
    best: dict[str, dict] = {}
    for i in range(repeat):
        for m in methods:
            if m == "hta" and (i or hta_python is None):
                continue
            r = measure(m, trace, hta_python if m == "hta" else sys.executable, chunked_mb)
            if m not in best or r["wall"] < best[m]["wall"]:
                best[m] = r
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument(
        "--cuda", action="store_true", help="big_trace.py's synthetic CUDA trace of each size"
    )
    parser.add_argument(
        "--chunked-mb",
        type=int,
        default=CHUNKED_MB,
        help="the chunked method's memory budget in MB (a trace of 64 MB or more whose mapping, "
        "about 0.6x its JSON, is over it is imported in chunks)",
    )
    parser.add_argument(
        "--hta-python",
        metavar="PYTHON",
        help="a python with holistictraceanalysis installed: also time HTA's TraceAnalysis once "
        "(HTA needs pandas and jupyterlab, so it lives in its own venv, not in requirements)",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        metavar="N",
        help="N rank files of --mb MB each (big_trace.write_ranks)",
    )
    args = parser.parse_args()
    methods = tuple(args.methods) + (("hta",) if args.hta_python else ())
    print(
        "| trace | MB | events | method | wall s | CPU s | peak RSS MB | tree peak MB "
        "| tree / JSON | added MB | added / JSON |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mb in args.mb:
        trace = _trace(args.cuda, args.ranks, mb)
        files = sorted(trace.iterdir()) if trace.is_dir() else [trace]
        size = sum(f.stat().st_size for f in files) / 1e6
        events = len(files) * _events(files[0])  # a job's ranks are copies of rank 0
        for m, r in bench(trace, args.repeat, methods, args.hta_python, args.chunked_mb).items():
            added = r["peak"] - r["base"]
            print(
                f"| {trace.name} | {size:.0f} | {events} | {m} | {r['wall']:.2f} | "
                f"{r['cpu']:.2f} | {r['peak']:.0f} | {r['tree']:.0f} | {r['tree'] / size:.2f}x | "
                f"{added:.0f} | {added / size:.2f}x |",
                flush=True,
            )
    return 0


def _trace(cuda: bool, ranks: int | None, mb: int) -> Path:
    """The trace of `mb` MB (a folder of `ranks` such files), written or recorded if missing."""
    import big_trace
    from import_record import DATA, record_size

    if ranks:
        folder = DATA / f"cuda_{ranks}x{mb}mb"
        if not folder.exists():
            big_trace.write_ranks(folder, ranks, mb)
        return folder
    trace = DATA / f"{'cuda' if cuda else 'transformer'}_{mb}mb.pt.trace.json"
    if not trace.exists():
        if cuda:
            big_trace.write(trace, mb)
        else:
            record_size(mb)
    return trace


def _events(trace: Path) -> int:
    with trace.open("rb") as f:
        return sum(chunk.count(b'"ph":') for chunk in iter(lambda: f.read(1 << 24), b""))


if __name__ == "__main__":
    sys.exit(main())

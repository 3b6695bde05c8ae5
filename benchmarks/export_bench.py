"""Export speed and peak memory: Perfetto JSON (.json and .json.gz) and CSV, on profiles of 1M
and 4M events made by tiling a real imported trace (the V100 ns-resolution trace: real names,
args, flows and nesting) along the time axis. Each export runs in a fresh process so its peak
RSS is its own.

    .venv/bin/python benchmarks/export_bench.py [--events 1000000 4000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests/data/kineto-gpu/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # fmt: skip


def tiled_profile(out: Path, events: int) -> None:
    """Import the seed trace and repeat its events back to back until there are `events` rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from neuron_explorer.importers import import_traces
    from neuron_explorer.model import Profile, ProfileWriter

    prof = Profile.open(import_traces([TRACE], out.with_name(out.name + "-seed")))
    base = prof.table("events")
    span = pc.max(pc.add(base["start_ns"], base["dur_ns"])).as_py() + 1000
    id_step = pc.max(base["id"]).as_py() + 1
    flow_step = (pc.max(base["flow_id"]).as_py() or 0) + 1
    parts = []
    for k in range(-(-events // base.num_rows)):
        t = base
        for col, step in (("id", id_step), ("parent_id", id_step), ("flow_id", flow_step),
                          ("start_ns", span)):  # fmt: skip
            i = t.schema.get_field_index(col)
            t = t.set_column(i, col, pc.add(t[col], pa.scalar(k * step, pa.int64())))
        parts.append(t)
    with ProfileWriter(out) as w:
        w.write_events(pa.concat_tables(parts).slice(0, events))
        w.commit(prof.manifest)


def run_export(profile: Path, fmt: str, out: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one export in a fresh process."""
    code = (
        "import sys; from neuron_explorer.model import Profile; from neuron_explorer.exporters import export;"
        "export(Profile.open(sys.argv[1]), sys.argv[2], sys.argv[3])"
    )
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, str(profile), fmt, str(out)])
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"export {fmt} failed with status {status}")
    return seconds, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--build", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:  # in a child process, so the parent stays small (peak RSS survives fork+exec)
        tiled_profile(Path(args.build), args.events[0])
        return 0

    print("| events | format | output | seconds | events/s | peak RSS MiB | output MiB |")
    print("|---:|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for n in args.events:
            prof = tmp / f"p{n}"
            build = [sys.executable, __file__, "--build", str(prof), "--events", str(n)]
            subprocess.run(build, check=True)
            for fmt, name in (("perfetto", "t.json"), ("perfetto", "t.json.gz"), ("csv", "t-csv")):
                out = tmp / name
                seconds, rss = run_export(prof, fmt, out)
                size = sum(p.stat().st_size for p in out.rglob("*")) if out.is_dir() else out.stat().st_size  # fmt: skip
                print(f"| {n:,} | {fmt} | {name} | {seconds:.1f} | {n / seconds:,.0f} | "
                      f"{rss:.0f} | {size / 2**20:.0f} |", flush=True)  # fmt: skip
                subprocess.run(["rm", "-rf", str(out)], check=True)
            subprocess.run(["rm", "-rf", str(prof)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

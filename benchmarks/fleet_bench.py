"""Fleet scale (issue 13): import 8 ranks of ~50 MB each, and analyse 64 ranks across ranks.

    .venv/bin/python benchmarks/fleet_bench.py [--ranks 8] [--mb 50] [--analysis-ranks 64]

Import: each rank's trace is the real V100 training trace of tests/data/kineto-gpu repeated
(shifted in time, one copy after the other) to about --mb MB of JSON, with its own
distributedInfo (rank, world size); `neuron-explorer import` of the directory is timed in a
fresh process. Analysis: the ranks of the committed 2-rank capture samples/profiles/ddp_straggler
copied into --analysis-ranks rank parts (rank 1's part, the slow one, for one planted rank; rank
0's for every other) and assembled into one rank-partitioned profile; then summarize (with its
per-rank table) and the cross-rank rules are timed, and the planted rank must be the straggler
found.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = (
    ROOT / "tests/data/kineto-gpu/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
)
SAMPLE = ROOT / "samples" / "profiles" / "ddp_straggler"


def make_rank_traces(out: Path, ranks: int, mb: float) -> list[Path]:
    """`ranks` trace files of about `mb` MB each, from the real trace repeated in time."""
    with gzip.open(TRACE, "rt") as f:
        base = json.load(f)
    events = base["traceEvents"]
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000.0
    one = len(json.dumps(events)) / 1e6
    copies = max(1, round(mb / one))
    files = []
    for rank in range(ranks):
        doc = dict(base)
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": ranks}
        doc["traceEvents"] = [
            {**e, "ts": e["ts"] + k * span} if isinstance(e.get("ts"), (int, float)) else e
            for k in range(copies)
            for e in events
        ]
        path = out / f"rank{rank}.pt.trace.json"
        path.write_text(json.dumps(doc))
        files.append(path)
    return files


def bench_import(ranks: int, mb: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp) / "traces"
        traces.mkdir()
        files = make_rank_traces(traces, ranks, mb)
        size = sum(f.stat().st_size for f in files) / 1e6
        t0, c0 = time.perf_counter(), os.times()
        subprocess.run(
            [sys.executable, "-m", "neuron_explorer", "import", str(traces), "-o",
             str(Path(tmp) / "run"), "-q"],
            check=True,
        )  # fmt: skip
        wall, c1 = time.perf_counter() - t0, os.times()
        return {"ranks": ranks, "total_mb": round(size, 1), "wall_s": round(wall, 2),
                "cpu_s": round((c1.children_user + c1.children_system)
                               - (c0.children_user + c0.children_system), 2)}  # fmt: skip


def _part(profile, rank_from: int, rank_to: int, out: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    from neuron_explorer.model.io import ProfileWriter

    def mine(t: pa.Table) -> pa.Table:
        return t.filter(pc.equal(t.column("rank"), rank_from))

    with ProfileWriter(out) as w:
        w.write_events(mine(profile.table("events")))
        w.write_table("stacks", profile.table("stacks"))
        w.write_table("counters", mine(profile.table("counters")))
        steps = tuple(
            replace(s, rank=rank_to) for s in profile.manifest.steps if s.rank == rank_from
        )
        w.commit(replace(profile.manifest, ranks=(rank_to,), steps=steps))


def bench_analysis(ranks: int, planted: int) -> dict:
    from neuron_explorer.analysis import run_rules, summarize
    from neuron_explorer.analysis.context import context
    from neuron_explorer.model import Profile, combine

    sample = Profile.open(SAMPLE)
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job"
        combine.parts_dir(job).mkdir()
        t0 = time.perf_counter()
        for r in range(ranks):
            _part(sample, 1 if r == planted else 0, r, combine.part_path(job, r))
        combine.assemble(job, ranks, "fleet-bench")
        build = time.perf_counter() - t0
        p = Profile.open(job)
        t0 = time.perf_counter()
        s = summarize(p)
        t_summary = time.perf_counter() - t0
        context(p)  # the rules' timing below excludes building the shared context again
        t0 = time.perf_counter()
        found = run_rules(p, ids=["straggler", "collective-outliers", "collective-share"])
        t_rules = time.perf_counter() - t0
        stragglers = sorted(f.evidence.metrics["rank"] for f in found if f.rule == "straggler")
        return {"ranks": ranks, "events": p.row_count("events"), "assemble_s": round(build, 2),
                "summarize_s": round(t_summary, 2), "cross_rank_rules_s": round(t_rules, 2),
                "ranks_table_rows": len(s.ranks_table.rows) if s.ranks_table else 0,
                "stragglers_found": stragglers, "planted": planted}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--analysis-ranks", type=int, default=64)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(json.dumps({"load_1min": round(load, 1), "import": bench_import(args.ranks, args.mb)}))
    planted = min(17, args.analysis_ranks - 1)
    print(json.dumps({"analysis": bench_analysis(args.analysis_ranks, planted)}))


if __name__ == "__main__":
    main()

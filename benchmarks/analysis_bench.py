"""Time every analysis rule and the summary on a profile of about a million events.

The first rule to run also reads the events (one pyarrow decode shared by every rule).
The profile is a real trace (the V100 training trace in tests/data/kineto-gpu/) imported
and then repeated back to back in time until it holds TARGET_EVENTS events, so the rules see
real shapes of data at scale. Usage: .venv/bin/python benchmarks/analysis_bench.py [EVENTS]
BENCH_REPEAT=N adds the CPU time of the rules and the summary with the events already read, the
least of N fresh opens per rule: a figure that a loaded machine's waits do not inflate.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from neuron_explorer.analysis import all_rules, summarize  # noqa: E402
from neuron_explorer.importers import import_traces  # noqa: E402
from neuron_explorer.model.io import ProfileWriter  # noqa: E402
from neuron_explorer.model.profile import Profile  # noqa: E402

TRACE = (
    ROOT / "tests/data/kineto-gpu/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
)
TARGET_EVENTS = 1_000_000
GOAL_S = 3.0


def repeat_profile(src: Profile, out: Path, target: int) -> Profile:
    """Write `src`'s events repeated back to back (ids, links, steps and times shifted)."""
    ev = src.table("events")
    span = int(pc.max(pc.add(ev["start_ns"], ev["dur_ns"])).as_py()) + 1
    max_id = int(pc.max(ev["id"]).as_py()) + 1
    max_step = int(pc.max(ev["step"]).as_py() or 0) + 1
    copies = -(-target // ev.num_rows)
    parts = []
    for i in range(copies):
        cols = {name: ev[name] for name in ev.column_names}
        for name in ("id", "parent_id", "flow_id"):
            cols[name] = pc.add(ev[name], i * max_id)
        cols["start_ns"] = pc.add(ev["start_ns"], i * span)
        cols["step"] = pc.add(ev["step"], pa.scalar(i * max_step, pa.int32()))
        parts.append(pa.table(cols))
    events = pa.concat_tables(parts)
    steps = tuple(
        replace(s, step=s.step + i * max_step, start_ns=s.start_ns + i * span)
        for i in range(copies)
        for s in src.manifest.steps
    )
    with ProfileWriter(out) as w:
        w.write_events(events)
        w.write_table("stacks", src.table("stacks"))
        w.write_table("counters", src.table("counters"))
        w.commit(replace(src.manifest, steps=steps))
    return Profile.open(out)


def main() -> int:
    target = int(sys.argv[1]) if len(sys.argv) > 1 else TARGET_EVENTS
    keep = os.environ.get("BENCH_PROFILE")  # reuse the profile an earlier run left there
    with tempfile.TemporaryDirectory() as tmp:
        if keep and Path(keep).exists():
            prof = Profile.open(keep)
        else:
            base = Profile.open(import_traces([TRACE], Path(tmp) / "base"))
            prof = repeat_profile(base, Path(keep or Path(tmp) / "big"), target)
        n = prof.row_count("events")
        times = {}
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        findings = 0
        for rid, rule in all_rules().items():
            t = time.perf_counter()
            findings += len(rule.evaluate(prof))
            times[rid] = time.perf_counter() - t
        rules_s = time.perf_counter() - t0
        rules_cpu = time.process_time() - cpu0
        t = time.perf_counter()
        summarize(prof)
        summary_s = time.perf_counter() - t
    print(f"profile: {n:,} events ({TRACE.name} repeated), {findings} findings")
    print("| rule | seconds |\n|---|---|")
    for rid, secs in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"| {rid} | {secs:.3f} |")
    print(f"| **all rules** (reading the events included) | **{rules_s:.2f}** |")
    print(f"| all rules, CPU time of the process (all threads) | {rules_cpu:.2f} |")
    print(f"| summarize (after the rules, sharing their cache) | {summary_s:.2f} |")
    repeat = int(os.environ.get("BENCH_REPEAT", "0"))
    if repeat and keep:
        cpu_only(Profile.open(keep).path, repeat)
    ok = rules_s < GOAL_S
    print(f"goal: all rules under {GOAL_S:.0f} s: {'met' if ok else 'NOT met'}")
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0 if ok else 1


def cpu_only(path: Path, repeat: int) -> None:
    """Per rule and for the summary, the least CPU time over `repeat` fresh opens of the
    profile whose events are read first (that read is the same for every rule)."""
    from neuron_explorer.analysis.context import context

    best: dict[str, float] = {}
    for _ in range(repeat):
        prof = Profile.open(path)
        context(prof).cols  # noqa: B018 - reads the events
        for rid, rule in all_rules().items():
            t = time.process_time()
            rule.evaluate(prof)
            best[rid] = min(best.get(rid, float("inf")), time.process_time() - t)
        t = time.process_time()
        summarize(prof)
        best["summarize"] = min(best.get("summarize", float("inf")), time.process_time() - t)
    rules = sum(v for k, v in best.items() if k != "summarize")
    print(
        f"CPU, events read first, least of {repeat}: all rules {rules:.3f} s, "
        f"summarize {best['summarize']:.3f} s"
    )


if __name__ == "__main__":
    sys.exit(main())

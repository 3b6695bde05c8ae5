"""Where the modeled host clock of a GPT-2 step differs from the plain CPU (issue 14, diagnosis).

Run: .venv/bin/python benchmarks/host_clock_table.py [--steps N] [--top N]

Two lists, from the same tiny Hugging Face GPT-2 step as benchmarks/host_clock_bench.py:
1. recorded runtime calls and clock-only pauses (`cut`, `gc`) nested in or overlapping another
   on the same thread: the HostClock's calls sorted by start; an overlap is a span cut twice or
   a stall of the clock (session 4's `_has_compatible_shallow_copy_type` inside a launch);
2. per aten op name: calls per step, its median time on the plain CPU (torch.profiler, the same
   step) and on the modeled neuron host clock, and (modeled - CPU) x calls: the op's share of
   the excess per step. Only top-level ops (no aten op around them) add up to a step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_clock_bench import _events, _profile, tiny_gpt2


def cpu_ops(steps: int) -> dict[str, tuple[float, float, bool]]:
    """op -> (calls per step, median us, top-level) on the plain CPU under torch.profiler."""
    step = tiny_gpt2("cpu")
    for _ in range(2):
        step()
    kept: list = []
    _profile(step, steps, lambda prof: kept.extend(_events(prof)))
    by: dict[str, list[float]] = {}
    top: dict[str, bool] = {}
    for e in kept:
        if not e.name.startswith("aten::"):
            continue
        by.setdefault(e.name, []).append(e.time_range.elapsed_us())
        parent = e.cpu_parent
        top[e.name] = top.get(e.name, False) or not (parent and parent.name.startswith("aten::"))
    return {k: (len(v) / steps, statistics.median(v), top[k]) for k, v in by.items()}


def neuron_ops(steps: int, workdir: Path) -> tuple[dict, list]:
    """(op -> (calls per step, median modeled us, top-level), the raw runtime events)."""
    import neuron_explorer
    from neuron_explorer.capture import handler
    from neuron_explorer.model.profile import Profile

    seen: list = []
    merge = handler.merge

    def keep(events, origin, runtime, **kw):  # the runtime events exactly as merge sees them
        seen.append(list(runtime))
        return merge(events, origin, runtime, **kw)

    handler.merge = keep  # type: ignore[assignment]
    try:
        step = tiny_gpt2("neuron")
        for _ in range(2):
            step()
        out = workdir / f"neuron-{os.getpid()}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _profile(step, steps, neuron_explorer.trace_handler(out))
    finally:
        handler.merge = merge  # type: ignore[assignment]
    con = Profile.open(out).duckdb()
    rows = con.execute(
        "SELECT e.name, count(*), median(e.dur_ns) / 1e3, "
        "bool_or(p.name IS NULL OR p.name NOT LIKE 'aten::%') FROM events e "
        "LEFT JOIN events p ON e.parent_id = p.id WHERE e.layer = 'host' AND e.kind = 'op' "
        "AND e.name LIKE 'aten::%' GROUP BY e.name").fetchall()  # fmt: skip
    return {r[0]: (r[1] / steps, r[2], r[3]) for r in rows}, seen[-1] if seen else []


def overlaps(runtime: list) -> list[tuple]:
    """(tid, outer kind/name, inner kind/name, overlap ns) for calls that overlap on one thread."""
    from neuron_explorer.vocab.kinds import NEURON_HOST_KINDS

    # exactly the records capture/merge.py gives the HostClock: host calls and the pauses
    kinds = {*NEURON_HOST_KINDS, "cut", "gc"}
    clock = [e for e in runtime if e.host_start_ns is not None and e.kind in kinds]
    clock.sort(key=lambda e: (e.tid, e.host_start_ns, e.host_end_ns))
    out: list[tuple] = []
    last: dict = {}
    for e in clock:
        prev = last.get(e.tid)
        if prev is not None and e.host_start_ns < prev.host_end_ns:
            out.append((e.tid, f"{prev.kind} {prev.op_name or prev.name}",
                        f"{e.kind} {e.op_name or e.name}",
                        min(prev.host_end_ns, e.host_end_ns) - e.host_start_ns))  # fmt: skip
        if prev is None or e.host_end_ns > prev.host_end_ns:
            last[e.tid] = e
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cpu = cpu_ops(a.steps)
        dev, runtime = neuron_ops(a.steps, Path(tmp))
    print(f"load {os.getloadavg()[0]:.1f}")
    laps = overlaps(runtime)
    print(f"{len(laps)} recorded calls overlap another on one thread")
    for tid, outer, inner, ns in laps[:20]:
        print(f"  thread {tid}: {inner} inside {outer} ({ns / 1e3:.1f} us)")
    rows = []
    for op, (n, us, top) in dev.items():
        c = cpu.get(op)
        c_us = c[1] if c else 0.0
        rows.append((op, n, c[0] if c else 0.0, c_us, us, (us - c_us) * n, top))
    rows.sort(key=lambda r: -abs(r[5]))
    print("| op | calls/step neuron (CPU) | CPU us | neuron modeled us | excess us/step | top |")
    print("|---|---:|---:|---:|---:|---|")
    for op, n, cn, c_us, us, ex, top in rows[: a.top]:
        print(
            f"| {op} | {n:.0f} ({cn:.0f}) | {c_us:.1f} | {us:.1f} | {ex:.0f} | {'y' if top else ''} |"
        )
    excess = sum(r[5] for r in rows if r[6])
    print(f"top-level ops' excess per step: {excess / 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

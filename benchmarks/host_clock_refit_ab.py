"""The round trip's refit (runtime/hostcost.refit) on and off in one process, rounds alternated.

Run: .venv/bin/python benchmarks/host_clock_refit_ab.py [--rounds N]

Separate processes on this loaded machine differ by more than the change (host_clock_bench.py
gave 1.26-2.23x for the same tree in five runs at load 3-5), so each round here runs the plain
CPU step and the neuron step twice, once with the loop's figures only (no refit) and once
refitting from the recording's gaps, in turns, and takes each side's `robust_step` (every
event and gap at its median over all steps) against the CPU's framework time. The in-place
cap (an in-place op cuts at most the loop's figure) is code, on in both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_clock_bench as bench

from neuron_explorer.backend.runtime import hostcost

OPS = ("aten::view", "aten::reshape", "aten::transpose", "aten::add_", "aten::mul")


def neuron_side(refit: bool, workdir: Path) -> dict:
    """One neuron round starting from the loop's figures, refitting or not."""
    hostcost.calibrate()
    hostcost.GAPS.clear()
    hostcost.OUTSIDE_NS, hostcost.OUTSIDE_GRAD_NS = hostcost.LOOP_NS, hostcost.LOOP_GRAD_NS
    saved = hostcost.BATCH
    hostcost.BATCH = saved if refit else 1 << 62
    try:
        res = bench.neuron_round(3, workdir)
    finally:
        hostcost.BATCH = saved
    res["fit"] = hostcost.OUTSIDE_NS
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cpu: list[dict] = []
    sides: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            cpu.append(bench.cpu_round(3))
            for refit in (False, True) if r % 2 == 0 else (True, False):
                sides[refit].append(neuron_side(refit, Path(tmp)))
    framework = bench.robust_step(cpu) - statistics.median(c["kernel_ns"] for c in cpu)
    off, on = bench.robust_step(sides[False]), bench.robust_step(sides[True])
    print(f"load {os.getloadavg()[0]:.1f}; loop figure {hostcost.LOOP_NS / 1e3:.1f} us, refit "
          f"per round {[round(s['fit'] / 1e3, 1) for s in sides[True]]} us; CPU framework "
          f"{framework / 1e6:.2f} ms; neuron modeled host step: refit off {off / 1e6:.2f} ms "
          f"({off / framework:.2f}x), on {on / 1e6:.2f} ms ({on / framework:.2f}x)")  # fmt: skip
    for op in OPS:
        per = [
            statistics.median(s["op_ns"].get(op, 0) for s in sides[k]) / 1e3 for k in (False, True)
        ]
        print(f"  {op:16s} modeled us: off {per[0]:5.1f}  on {per[1]:5.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

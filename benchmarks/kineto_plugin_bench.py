"""What `ProfilerActivity.PrivateUse1` (the device's Kineto plugin) costs over a CPU-only profile:
per recorded op (the plugin logs each op's correlation push and pop) and at the profiler's stop
(the runtime's activities handed to Kineto, its events encoded into the trace, and torch's own
post-processing of the extra activities). Both profiles alternate in one process, best of
--repeat. Usage: python benchmarks/kineto_plugin_bench.py [--ops 2000] [--repeat 5]"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import neuron_explorer.backend  # noqa: F401 - registers the device


def run(ops: int, activities: list) -> tuple[float, float]:
    """(us per op while recording, ms of the profiler's stop)."""
    x = torch.randn(32, 32, device="neuron")
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        y = x
        for _ in range(ops):
            y = y + 1.0
        y.sum().item()
        t1 = time.perf_counter()
    t2 = time.perf_counter()
    prof.key_averages()
    return 1e6 * (t1 - t0) / ops, 1e3 * (t2 - t1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    kinds = {"CPU": [ProfilerActivity.CPU],
             "CPU + PrivateUse1": [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]}  # fmt: skip
    run(200, kinds["CPU + PrivateUse1"])  # warm: kernels lowered, the plugin built and loaded
    best: dict[str, list[float]] = {k: [float("inf")] * 2 for k in kinds}
    for _ in range(args.repeat):
        for name, activities in kinds.items():
            per_op, stop = run(args.ops, activities)
            best[name] = [min(best[name][0], per_op), min(best[name][1], stop)]
    print(f"| activities | us per recorded op | stop ms ({args.ops} kernels) |")
    print("|---|---|---|")
    for name, (per_op, stop) in best.items():
        print(f"| {name} | {per_op:.1f} | {stop:.0f} |")


if __name__ == "__main__":
    main()

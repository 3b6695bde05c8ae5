"""The neuron op path per call (issue 16): CPU us per op, recorded (profiler on) and not.

Run: .venv/bin/python benchmarks/op_path_bench.py; for an A/B, run it alternately with another
tree's `neuron_explorer` first on PYTHONPATH (`git archive REV neuron_explorer | tar -x -C DIR`).
Each figure is the best of 30 rounds of a 500-call loop (CPU time, so a preemption drops out).
"""

from __future__ import annotations

import time
import warnings

import torch

N, ROUNDS = 500, 30


def per_call_us(fn, clear) -> float:
    best = None
    for _ in range(ROUNDS):
        t = time.process_time_ns()
        for _ in range(N):
            fn()
        d = (time.process_time_ns() - t) / N
        best = d if best is None else min(best, d)
        clear()  # the runtime's recorded events, so the buffer does not grow
    return (best or 0.0) / 1e3


def main() -> None:
    warnings.simplefilter("ignore")
    import neuron_explorer
    from neuron_explorer.backend import events

    torch.set_num_threads(1)
    x, y = torch.zeros(16, device="neuron"), torch.ones(16, device="neuron")
    a, b = torch.randn(16, 16, device="neuron"), torch.randn(16, 16, device="neuron")
    ops = {"add_": lambda: x.add_(y), "mm": lambda: torch.mm(a, b), "view": lambda: x.view(-1)}
    res = {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        for f in ops.values():
            f()
        res = {k: per_call_us(f, events.clear) for k, f in ops.items()}
    res["add_ off"] = per_call_us(ops["add_"], events.clear)
    res["view off"] = per_call_us(ops["view"], events.clear)
    print(neuron_explorer.__file__, " ".join(f"{k} {v:.2f}" for k, v in res.items()))


if __name__ == "__main__":
    main()

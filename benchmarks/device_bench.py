"""Dispatch overhead of the neuron device: a tiny op and a TinyGPT training step, neuron vs CPU
eager, with the profiler off and on.

Run: .venv/bin/python benchmarks/device_bench.py [--calls N] [--steps N] [--rounds N]
Goals (issue 3): at most 15 us per op with the profiler off and 20 us on, and a training step at
most 3x CPU eager. Per-op overhead = neuron time per op minus CPU time per op. Times are process
CPU time with one torch thread, best of several rounds (the least disturbed on a shared machine),
CPU and neuron rounds taking turns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from neuron_explorer import backend
from neuron_explorer.backend.runtime.model import schedule_pending

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))
from models import TinyGPT, lm_loss, token_batch


def best_us(fns, calls: int, rounds: int = 5) -> list[tuple[float, float]]:
    """(best, median) of `rounds` for each of `fns`, in CPU microseconds per call (process
    time: steadier than wall time on a shared machine; torch runs one intra-op thread here, so
    it is comparable). The functions take turns round by round, so a burst of load from the
    other users of the machine hits them alike. Each round ends by placing the kernels it
    launched on the device timeline, which the runtime defers to the next sync or drain: that
    work is part of the per-op cost."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            t0 = time.process_time()
            for _ in range(calls):
                fn()
            schedule_pending()
            times[i].append((time.process_time() - t0) / calls * 1e6)
    return [(min(t), statistics.median(t)) for t in times]


def tiny_op(device: str, scalar: bool):
    """x.add_(y) on 8 elements; with `scalar`, x.add_(1), which torch converts to a tensor twice
    on the way through __torch_dispatch__ (once per dispatch)."""
    x, y = torch.ones(8, device=device), torch.ones(8, device=device)
    op = (lambda: x.add_(1)) if scalar else (lambda: x.add_(y))
    for _ in range(100):
        op()
    return op


def train_step(device: str):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = TinyGPT(layers=2).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = token_batch(8, 32, 256, gen).to(device)

    def step():
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()

    step()
    return step


class profiled:
    """A recording torch.profiler session; the backend's events are drained on exit."""

    def __enter__(self):
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.prof.__enter__()

    def __exit__(self, *exc):
        self.prof.__exit__(*exc)
        self.events = len(backend.events.drain())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of ops and of steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for label, ctx in (("off", None), ("on", profiled)):
        cm = ctx() if ctx else None
        if cm:
            cm.__enter__()
        ops = {}
        for name, scalar in (("add_(y)", False), ("add_(1)", True)):
            pair = [tiny_op("cpu", scalar), tiny_op("neuron", scalar)]
            ops[name] = best_us(pair, args.calls, args.rounds)
        steps = [train_step("cpu"), train_step("neuron")]
        cpu_step, dev_step = best_us(steps, args.steps, args.rounds)
        if cm:
            cm.__exit__(None, None, None)
        rows.append((label, ops, cpu_step, dev_step))
    print("| profiler | op | CPU us | neuron us | overhead us/op | median overhead | CPU step ms |"
          " neuron step ms | step ratio | median ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, ops, (cpu_s, cpu_s_med), (dev_s, dev_s_med) in rows:
        for name, ((cpu_op, cpu_med), (dev_op, dev_med)) in ops.items():
            print(f"| {label} | {name} | {cpu_op:.1f} | {dev_op:.1f} | {dev_op - cpu_op:.1f} |"
                  f" {dev_med - cpu_med:.1f} | {cpu_s / 1000:.1f} | {dev_s / 1000:.1f} |"
                  f" {dev_s / cpu_s:.2f}x | {dev_s_med / cpu_s_med:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()

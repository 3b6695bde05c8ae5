"""Per-call cost of the NeuronCore cost model: lower_op (cache hit and miss) and submit.

Run: .venv/bin/python benchmarks/costmodel_bench.py [--calls N]
The device backend calls lower_op + DeviceTimeline.submit once per op while a profiler records;
the goal is under 20 us per call for typical ops (docs/costmodel.md).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from neuron_explorer.backend.costmodel import DeviceTimeline, TensorInfo, get_spec, lower_op
from neuron_explorer.backend.costmodel.lowering import _CACHE


def per_call_us(fn: Callable[[int], object], calls: int, rounds: int = 5) -> float:
    """Best of `rounds` of `calls` calls, in microseconds per call (best: least disturbed)."""
    best = float("inf")
    for r in range(rounds):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(r * calls + i)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    spec = get_spec()
    tl = DeviceTimeline(spec)
    x = (64, 256)

    def add_hit(_i):
        t = TensorInfo(x, "float32")
        return lower_op("aten::add.Tensor", [t, t], [t], spec)

    def add_miss(_i):  # the same op with an empty cache: what a new shape costs
        _CACHE.clear()
        return add_hit(0)

    def mm_miss(_i):
        _CACHE.clear()
        a, b = TensorInfo((64, 256), "float32"), TensorInfo((256, 256), "float32")
        return lower_op("aten::mm", [a, b], [TensorInfo((64, 256), "float32")], spec)

    add = add_hit(0)
    mm = mm_miss(0)
    big = lower_op("aten::mm", [TensorInfo((2048, 2048), "bfloat16")] * 2,
                   [TensorInfo((2048, 2048), "bfloat16")], spec)  # fmt: skip

    def step(i):  # what one recorded eager op costs: lower (cache hit) then schedule
        return tl.submit(add_hit(i), ready_ns=i * 1000)

    rows = [
        ("lower_op add 64x256, cache hit", add_hit, len(add.instrs)),
        ("lower_op add, new shape (miss)", add_miss, len(add.instrs)),
        ("lower_op mm 64x256x256, new shape (miss)", mm_miss, len(mm.instrs)),
        ("submit add 64x256", lambda i: tl.submit(add, ready_ns=i * 1000), len(add.instrs)),
        ("submit mm 64x256x256", lambda i: tl.submit(mm, ready_ns=i * 1000), len(mm.instrs)),
        ("submit mm 2048^3 bf16", lambda i: tl.submit(big, ready_ns=i * 10**6), len(big.instrs)),
        ("lower_op (hit) + submit, add 64x256", step, len(add.instrs)),
        ("... + run.instrs (profile with instructions)", lambda i: step(i).instrs, len(add.instrs)),
    ]
    # the same Python loop on a quiet machine of this class takes ~130 us: scale by it under load
    ref = per_call_us(lambda _i: sum(range(10000)), 50)
    print(
        f"spec {spec.name}; best of 5 rounds x {args.calls} calls; sum(range(10000)): {ref:.0f} us"
    )
    print(f"{'call':48} {'instrs':>6} {'us/call':>8}")
    for label, fn, n in rows:
        calls = args.calls if n < 100 else max(1, args.calls // 20)
        print(f"{label:48} {n:>6} {per_call_us(fn, calls):>8.1f}")


if __name__ == "__main__":
    main()

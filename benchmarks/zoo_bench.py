"""Zoo step times: each model of tests/zoo_models.py trained on the neuron device against CPU
eager, with the profiler off and on, and GPT-2 under bf16 autocast against fp32 (on the device
and on the CPU, fp32 and bf16 steps alternating on one model).

    .venv/bin/python benchmarks/zoo_bench.py                 # every zoo model, 10 steps each
    .venv/bin/python benchmarks/zoo_bench.py --models gpt2 llama --steps 10
    .venv/bin/python benchmarks/zoo_bench.py --only-bf16     # the autocast comparison alone
    NEURON_PYTHON_AUTOCAST=1 .venv/bin/python benchmarks/zoo_bench.py --only-bf16  # Python kernels
    .venv/bin/python benchmarks/zoo_bench.py --only-bf16 --bf16-models gpt2 --kernels-ab

A step is forward, backward and AdamW; the figure is the best of `--steps` steps after two
warm-up steps (the eager compiles), in process CPU time with one torch thread unless
`--clock wall`. Printed as a Markdown table for benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from zoo_models import ZOO, ZooModel, on

import neuron_explorer.backend as backend

CLOCK = time.perf_counter  # main() may switch to this thread's CPU time


def _profiler():
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  record_shapes=True)  # fmt: skip


def step_ms(model: ZooModel, device: str, steps: int, profile: bool = False,
            autocast: torch.dtype | None = None, n: int = 2) -> float:  # fmt: skip
    """Best ms of a training step (forward, backward, AdamW, a loss read): on a shared, loaded
    machine the least disturbed step is the steadiest figure (the median moves with the load)."""
    torch.manual_seed(0)
    net = model.build().to(device).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    batch = on(model.batch(n), device)
    cast = torch.autocast(device_type=device, dtype=autocast) if autocast else nullcontext()
    times = []
    with _profiler() if profile else nullcontext():
        for i in range(steps + 2):
            t0 = CLOCK()
            with cast:
                loss = net(**batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            if i >= 2:
                times.append((CLOCK() - t0) * 1e3)
            if profile:
                backend.events.drain()  # what capture does at each step's end
    backend.events.clear()
    return min(times)


def wide_gpt2() -> ZooModel:
    """A GPT-2 wide enough that its matmuls, not Python, take most of a step."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def build():
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=512,
                                          n_positions=128))  # fmt: skip

    def batch(n):
        ids = torch.randint(0, 512, (n, 128), generator=torch.Generator().manual_seed(n))
        return {"input_ids": ids, "labels": ids.clone()}

    return ZooModel("gpt2-wide", build, batch, decoder=True)


def zoo_table(names: list[str], steps: int) -> None:
    print("| model | CPU ms | neuron ms | neuron / CPU | neuron, profiler on, ms | on / CPU |")
    print("|---|---|---|---|---|---|")
    for name in names:
        model = ZOO[name]
        cpu = step_ms(model, "cpu", steps)
        dev = step_ms(model, "neuron", steps)
        prof = step_ms(model, "neuron", steps, profile=True)
        print(f"| {name} | {cpu:.1f} | {dev:.1f} | {dev / cpu:.2f}x | {prof:.1f} | "
              f"{prof / cpu:.2f}x |", flush=True)  # fmt: skip


def autocast_ab(model: ZooModel, device: str, steps: int, n: int = 2) -> dict[bool, list[float]]:
    """ms of `steps` fp32 and `steps` bf16-autocast training steps of one model, alternating
    (the order swapped each round) after two warm-up steps of each, so that load from other
    work and the process's state (garbage, caches) hit both alike; keyed by bf16."""
    torch.manual_seed(0)
    net = model.build().to(device).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    batch = on(model.batch(n), device)

    def step(bf16: bool) -> None:
        cast = torch.autocast(device_type=device, dtype=torch.bfloat16) if bf16 else nullcontext()
        with cast:
            loss = net(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()

    for _ in range(2):
        step(False)
        step(True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(steps):
        for bf16 in (False, True) if i % 2 else (True, False):
            t0 = CLOCK()
            step(bf16)  # timed to its return: the step's outputs are freed inside, as in a loop
            times[bf16].append((CLOCK() - t0) * 1e3)
    return times


def bf16_table(steps: int, models: list[str]) -> None:
    print("\n| model | device fp32 ms | device bf16 ms | device bf16 / fp32 | "
          "CPU fp32 ms | CPU bf16 ms | CPU bf16 / fp32 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for model in [{"gpt2": ZOO["gpt2"], "gpt2-wide": wide_gpt2()}[m] for m in models]:
        cells = []
        for device in ("neuron", "cpu"):
            t = autocast_ab(model, device, steps)
            fp32, bf16 = sorted(t[False]), sorted(t[True])
            mid = len(fp32) // 2
            # each round's bf16 step over its fp32 neighbour: load that drifts over the run
            # hits both steps of a round alike
            paired = sorted(b / f for f, b in zip(t[False], t[True], strict=True))[mid]
            cells.append(f"{fp32[0]:.1f} / {fp32[mid]:.1f} | {bf16[0]:.1f} / {bf16[mid]:.1f} | "
                         f"{bf16[0] / fp32[0]:.2f}x / {bf16[mid] / fp32[mid]:.2f}x / "
                         f"{paired:.2f}x")  # fmt: skip
        print(f"| {model.name} | {cells[0]} | {cells[1]} |", flush=True)
    print(
        "\n(each cell: best / median step, and for the ratio the median of each round's "
        "bf16 / fp32; fp32 and bf16 steps alternate on one model)"
    )


def kernels_ab(steps: int) -> None:
    """Tiny GPT-2 bf16 steps in one process, autocast.cpp's kernels against the Python kernels
    (registered over them for one step, then dropped, which restores the C++ ones),
    alternating, order swapped each round."""
    from neuron_explorer.backend.runtime import autocast

    if autocast.kind != "native":
        print("\nkernels A/B: the C++ autocast kernels are not loaded")
        return
    ops = autocast._overloads()
    model = ZOO["gpt2"]
    torch.manual_seed(0)
    net = model.build().to("neuron").train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    batch = on(model.batch(2), "neuron")

    def step(python: bool) -> float:
        lib = torch.library.Library("aten", "IMPL")  # dropped on return
        for name, op, dtype in ops if python else ():
            lib.impl(name, autocast._kernel(op, dtype), "AutocastPrivateUse1")
        t0 = CLOCK()
        with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
            loss = net(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        return (CLOCK() - t0) * 1e3

    for python in (False, True, False, True):
        step(python)
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(steps):
        for python in (False, True) if i % 2 else (True, False):
            times[python].append(step(python))
    mid = steps // 2
    paired = sorted(p / c for c, p in zip(times[False], times[True], strict=True))[mid]
    c, p = sorted(times[False]), sorted(times[True])
    print(f"\nkernels A/B (tiny GPT-2 bf16 step, best / median): C++ {c[0]:.1f} / {c[mid]:.1f} ms, "
          f"Python {p[0]:.1f} / {p[mid]:.1f} ms, each round's Python / C++ {paired:.3f}x")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(ZOO), choices=list(ZOO))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only-bf16", action="store_true")
    parser.add_argument("--bf16-models", nargs="*", default=["gpt2", "gpt2-wide"],
                        choices=["gpt2", "gpt2-wide"])  # fmt: skip
    parser.add_argument("--kernels-ab", action="store_true",
                        help="also time bf16 steps with the C++ against the Python autocast "
                        "kernels in one process")  # fmt: skip
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="cpu (default): process CPU time (the autograd device thread "
                        "too), torch on one thread, steady on a loaded machine; wall: wall "
                        "time, torch's threads")  # fmt: skip
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    global CLOCK
    if args.clock == "cpu":
        torch.set_num_threads(1)
        CLOCK = time.process_time
    print(f"clock: {args.clock}")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")  # fmt: skip
    from neuron_explorer.backend.runtime import autocast

    # NEURON_PYTHON_AUTOCAST=1 runs the Python kernels: the A/B of the C++ ones
    print(f"autocast kernels: {autocast.kind}\n")
    for device in ("cpu", "neuron"):  # first use of the CPU kernels, transformers and the device
        step_ms(ZOO["gpt2"], device, 1)
    if not args.only_bf16:
        zoo_table(args.models, args.steps)
    bf16_table(args.steps, args.bf16_models)
    if args.kernels_ab:
        kernels_ab(args.steps)
    print(f"\nload at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

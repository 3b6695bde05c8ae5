"""One rank of tests/test_distributed.py: an all-reduce the program does not wait for at once.

`overlap_worker.py OUT`: in each step, a backlog of large matmuls (the device is behind the host,
as in a device-bound backward), an `async_op=True` all-reduce of a 64 MB buffer (it starts once
the backlog that may have produced it is done), a matmul on other tensors launched while it runs,
`work.wait()`, a kernel reading the reduced buffer, then a blocking all-reduce of a small tensor
and `.item()`; 2 steps recorded by `neuron_explorer.trace_handler(OUT)`.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import neuron_explorer

BIG = 16 * 2**20  # float32 elements: a 64 MB gradient bucket's worth


def step(big: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> float:
    # the ranks start the step together: they leave a blocking collective at one modeled
    # instant (a barrier runs on a CPU tensor, on gloo's own clock)
    dist.all_reduce(torch.zeros(1, device="neuron"))
    x = w
    for _ in range(6):
        x = x @ w  # the backlog: 6 ms of TensorE work, launched in far less
    work = dist.all_reduce(big, async_op=True)
    y = a @ a  # compute that does not touch `big`, shorter than the all-reduce
    work.wait()
    with torch.profiler.record_function("consume_reduced"):
        total = big.sum()
    small = total.reshape(1) + y.mean() + x.mean()
    dist.all_reduce(small)  # the program waits for this one
    return small.item()


def main() -> None:
    dist.init_process_group("neuron")
    big = torch.ones(BIG, device="neuron")
    a = torch.eye(512).to("neuron")
    w = torch.eye(2048).to("neuron")
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=neuron_explorer.trace_handler(sys.argv[1]),
    ) as prof:
        for _ in range(3):
            step(big, a, w)
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

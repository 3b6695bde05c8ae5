"""One rank of a 2-rank DDP job in which only rank 0 profiles (a common pattern): the ranks
must not wait on each other's clocks, and rank 0's profile names rank 1 as missing."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import neuron_explorer


def step(ddp, opt) -> None:
    ddp(torch.randn(8, 16).to("neuron")).square().mean().backward()
    opt.step()
    opt.zero_grad()


def main() -> None:
    dist.init_process_group("neuron")
    torch.manual_seed(0)
    ddp = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("neuron"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    if dist.get_rank() == 0:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
            on_trace_ready=neuron_explorer.trace_handler(sys.argv[1]),
        ) as prof:
            for _ in range(4):
                step(ddp, opt)
                prof.step()
    else:
        for _ in range(4):
            step(ddp, opt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

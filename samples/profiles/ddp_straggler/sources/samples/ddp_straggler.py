"""Data-parallel training on two neuron ranks where one rank logs synchronously each step.

Run under torchrun (the capture runs every rank and writes one profile):

    neuron-explorer capture -o profiles/ddp -- torchrun --nproc-per-node 2 samples/ddp_straggler.py

Rank 1 writes a log line and flushes it to disk in every step (about 30 ms here), so at each
gradient all-reduce rank 0 waits for it: `analyze` finds the straggler (rank 1) and the
collectives whose time is waiting, not transfer.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

LOG_FLUSH_S = 0.03  # what rank 1's synchronous log write costs per step


def slow_log(path: str, step: int, loss: float) -> None:
    with open(path, "a") as f:
        f.write(f"step {step} loss {loss:.4f}\n")
        f.flush()
        os.fsync(f.fileno())
    time.sleep(LOG_FLUSH_S)  # a slow disk or network file system, made repeatable


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("neuron")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).to("neuron"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    log = os.path.join(tempfile.gettempdir(), f"ddp_straggler_rank{rank}.log")
    for step in range(args.steps):
        x = torch.randn(32, 64, generator=data).to("neuron")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 1:
            slow_log(log, step, loss.item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

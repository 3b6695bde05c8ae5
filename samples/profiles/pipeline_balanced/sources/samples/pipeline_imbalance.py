"""Pipeline-parallel training on two neuron ranks whose stages hold unequal work.

Run under torchrun (the capture runs every rank and writes one profile):

    neuron-explorer capture -o profiles/pp -- torchrun --nproc-per-node 2 samples/pipeline_imbalance.py

An MLP of eight blocks is cut into two `torch.distributed.pipelining` stages run by a GPipe
schedule over 4 micro-batches. The cut puts one block on rank 0 and seven on rank 1, so rank 0
spends most of each step waiting to receive activations' gradients from rank 1: `analyze` finds
the imbalance and the pipeline bubbles. `--balanced` cuts it four and four.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import pipelining

BLOCKS, WIDTH, MICROBATCHES = 8, 256, 4


def block() -> nn.Module:
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--balanced", action="store_true", help="four blocks per stage")
    args = parser.parse_args()
    dist.init_process_group("neuron")
    rank = dist.get_rank()
    torch.manual_seed(0)
    blocks = [block() for _ in range(BLOCKS)]
    cut = BLOCKS // 2 if args.balanced else 1
    stage_blocks = blocks[:cut] if rank == 0 else blocks[cut:]
    part = nn.Sequential(*stage_blocks).to("neuron")
    stage = pipelining.PipelineStage(part, rank, 2, torch.device("neuron"))
    schedule = pipelining.ScheduleGPipe(stage, MICROBATCHES, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        x = torch.randn(32, WIDTH, generator=data).to("neuron")
        y = torch.randn(32, WIDTH, generator=data).to("neuron")
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

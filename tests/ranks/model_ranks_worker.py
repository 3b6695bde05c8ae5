"""One rank of tests/test_model_ranks.py's 8-rank test: a tiny DDP MLP, three SGD
steps on the neuron device, run under `neuron-explorer capture --model-ranks N` (rank 0 alone,
the others its copies), or under torchrun as `model_ranks_worker.py OUT`: every rank real, each
recording its second step into its own profile OUT/rank<N> (trace_handler's worker_name)."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import neuron_explorer


def main() -> None:
    dist.init_process_group("neuron")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).to("neuron")
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

    def step() -> None:
        ddp(torch.randn(32, 256, device="neuron")).square().mean().backward()
        opt.step()
        opt.zero_grad()

    if len(sys.argv) > 1:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1, warmup=0, active=1, repeat=1),
            on_trace_ready=neuron_explorer.trace_handler(sys.argv[1], f"rank{dist.get_rank()}"),
        ) as prof:
            for _ in range(3):
                step()
                prof.step()
    else:
        for _ in range(3):
            step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

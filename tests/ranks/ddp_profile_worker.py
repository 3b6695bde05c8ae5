"""One rank of a profiled DDP job for tests/test_distributed.py.

`ddp_profile_worker.py OUT SLOW_RANK SLEEP_S [QUIT_RANK]`: trains a small MLP with DDP on the
neuron device for 8 steps under `neuron_explorer.trace_handler(OUT)` (the last 7 recorded); rank
SLOW_RANK sleeps SLEEP_S in each recorded step (a planted straggler; -1 for none). QUIT_RANK, if
given, leaves before the profiler starts and never writes its part. With KINETO_DIR set in the
environment, each rank also writes its raw torch.profiler trace there (rank<N>.json). With
BUCKET_MB set, DDP's gradient buckets hold that many MB (several buckets: their all-reduces
overlap the rest of backward).
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import neuron_explorer

OUT, SLOW, SLEEP = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
QUIT = int(sys.argv[4]) if len(sys.argv) > 4 else -1


def main() -> None:
    dist.init_process_group("neuron")
    rank = dist.get_rank()
    if rank == QUIT:
        os._exit(0)  # gone before the profile: no part, no more collectives
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to("neuron")
    bucket = float(os.environ.get("BUCKET_MB", "25"))  # DDP's default
    ddp = DDP(model, bucket_cap_mb=bucket) if QUIT < 0 else model
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    handler = neuron_explorer.trace_handler(OUT)
    kineto = os.environ.get("KINETO_DIR")

    def ready(prof) -> None:
        raw = handler.collect(prof)  # the cycle's trace is exported once, by the handler
        if kineto:
            shutil.copy(raw.trace, os.path.join(kineto, f"rank{rank}.json"))
        handler.write(raw)

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        record_shapes=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=7, repeat=1),
        on_trace_ready=ready,
    ) as prof:
        for step in range(8):
            x = torch.randn(32, 64).to("neuron")
            if rank == SLOW and step >= 1:
                time.sleep(SLEEP)
            loss = ddp(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    if QUIT < 0:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

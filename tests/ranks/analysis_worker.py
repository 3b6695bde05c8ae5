"""One rank of tests/test_distributed_analysis.py: a program a new user would profile, captured
by `neuron_explorer.trace_handler(OUT)` in every rank.

`analysis_worker.py SCENARIO OUT [ARG]`:
- `pricing`: one recorded step of a 4 MB-a-rank all-gather (c10d and functional) and a
  reduce-scatter of a 4 MB-a-rank input.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import neuron_explorer

SCENARIO, OUT = sys.argv[1], sys.argv[2]
ARG = sys.argv[3] if len(sys.argv) > 3 else ""
SHARD = 2**20  # float32 elements: 4 MB a rank


def profiled(steps: int, body, warmup: int = 1) -> None:
    """Run `body(step)` for warmup + steps steps, the last `steps` recorded."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        record_shapes=True,
        schedule=torch.profiler.schedule(wait=0, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=neuron_explorer.trace_handler(OUT),
    ) as prof:
        for step in range(warmup + steps):
            body(step)
            prof.step()


def pricing(rank: int, n: int) -> None:
    import torch.distributed._functional_collectives as fc

    shard = torch.full((SHARD,), float(rank), device="neuron")
    whole = torch.empty(n * SHARD, device="neuron")

    def body(_step: int) -> None:
        dist.all_gather_into_tensor(whole, shard)
        gathered = fc.all_gather_tensor(shard, 0, dist.group.WORLD)
        mine = torch.empty(SHARD, device="neuron")
        dist.reduce_scatter_tensor(mine, whole)
        float((gathered.sum() + mine.sum()).cpu())

    profiled(1, body)


def main() -> None:
    dist.init_process_group("neuron")
    rank, n = dist.get_rank(), dist.get_world_size()
    {"pricing": pricing}[SCENARIO](rank, n)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

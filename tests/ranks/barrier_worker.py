"""One rank of tests/test_distributed.py: `dist.barrier()` modeled as a collective.

`barrier_worker.py OUT SLOW_RANK SLEEP_S`: 3 steps (the last 2 recorded by
`neuron_explorer.trace_handler(OUT)`), each a matmul on the neuron device, rank SLOW_RANK
sleeping SLEEP_S, `dist.barrier()`, then an all-reduce; each rank writes when it entered and
left each barrier (time.time_ns, the clock the ranks share) to OUT.rank<N>.json.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

import neuron_explorer

OUT, SLOW, SLEEP = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])


def main() -> None:
    dist.init_process_group("neuron")
    rank = dist.get_rank()
    w = torch.eye(256).to("neuron")
    real = []
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=neuron_explorer.trace_handler(OUT),
    ) as prof:
        for _ in range(3):
            x = (w @ w).sum()
            if rank == SLOW:
                time.sleep(SLEEP)
            t0 = time.time_ns()
            dist.barrier()
            real.append((t0, time.time_ns()))
            dist.all_reduce(x.reshape(1))
            prof.step()
    with open(f"{OUT}.rank{rank}.json", "w") as f:
        json.dump(real, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One rank of tests/test_distributed_analysis.py: a program a new user would profile, captured
by `neuron_explorer.trace_handler(OUT)` in every rank.

`analysis_worker.py SCENARIO OUT [ARG]`:
- `pricing`: one recorded step of a 4 MB-a-rank all-gather (c10d and functional) and a
  reduce-scatter of a 4 MB-a-rank input.
- `fsdp`: FSDP2 (`fully_shard` on each Linear and the whole MLP), the same work on every rank,
  no sync in the loop; 4 steps recorded.
- `straggler RANK`: DDP training, 6 steps recorded; rank RANK works 2 ms more in each step
  (a sleep before its backward, as a slow data loader's or a log write's).
- `pipeline CUT`: an MLP of 8 blocks of 8 layers in two `torch.distributed.pipelining` stages (GPipe, 4
  micro-batches), the first CUT blocks on rank 0 and the rest on rank 1; 8 steps recorded.
- `tp`: tensor parallelism (DTensor: an MLP split column- then row-wise) over all ranks, and
  `fsdp_tp`: FSDP2 over the `dp` dimension of a 2 x 2 mesh with the same split over `tp`;
  3 steps recorded, the losses written to OUT.rank<N>.json.
- `zero`: DDP with ZeroRedundancyOptimizer (Adam), 4 steps recorded, then the optimizer state
  consolidated on rank 0 (`consolidate_state_dict`, which loads each rank's state with
  `map_location` the device); rank 0 writes the consolidated state's step count to
  OUT.rank0.json.
- `crash RANK` / `kill RANK`: DDP training, 4 steps recorded; in the third, rank RANK raises a
  ValueError (`crash`) or is killed by SIGKILL (`kill`) before its backward.
"""

from __future__ import annotations

import os
import signal
import sys
import time

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


def ddp_steps(rank: int, n: int, steps: int, before_backward=None) -> None:
    """A small MLP trained with DDP, `steps` steps recorded; `before_backward(rank, step)` runs
    in each step between the forward and the backward."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to("neuron"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank)

    def body(step: int) -> None:
        loss = model(torch.randn(32, 64, generator=data).to("neuron")).square().mean()
        if before_backward is not None:
            before_backward(rank, step)
        loss.backward()
        opt.step()
        opt.zero_grad()

    profiled(steps, body)


def ending(rank: int, n: int) -> None:
    def die(me: int, step: int) -> None:
        if me == int(ARG) and step == 3:
            if SCENARIO == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError(f"[rank {me}] bad batch: 3 NaN labels")

    ddp_steps(rank, n, 4, die)


def fsdp(rank: int, n: int) -> None:
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("neuron", (n,))
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())])
    model = model.to("neuron")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)

    def body(_step: int) -> None:
        model(torch.randn(256, 512, generator=data).to("neuron")).square().mean().backward()
        opt.step()
        opt.zero_grad()

    profiled(4, body)


def straggler(rank: int, n: int) -> None:
    def extra(me: int, _step: int) -> None:
        if me == int(ARG):
            time.sleep(0.002)

    ddp_steps(rank, n, 6, extra)


def pipeline(rank: int, n: int) -> None:
    import torch.nn as nn
    from torch.distributed import pipelining

    torch.manual_seed(0)
    # a block of several layers: its own work outweighs what every stage repeats per step
    blocks = [nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(256, 256), nn.Tanh())])
              for _ in range(8)]  # fmt: skip
    cut = int(ARG)
    part = nn.Sequential(*(blocks[:cut] if rank == 0 else blocks[cut:])).to("neuron")
    stage = pipelining.PipelineStage(part, rank, n, torch.device("neuron"))
    schedule = pipelining.ScheduleGPipe(stage, 4, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(0)

    def body(_step: int) -> None:
        x = torch.randn(32, 256, generator=data).to("neuron")
        y = torch.randn(32, 256, generator=data).to("neuron")
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        opt.step()
        opt.zero_grad()

    profiled(8, body)  # the median of 7 steady steps: host noise of one step moves it little


def tensor_parallel(rank: int, n: int) -> None:
    import json

    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to("neuron")
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    if SCENARIO == "fsdp_tp":
        mesh = init_device_mesh("neuron", (2, n // 2), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(model, mesh["tp"], plan)
        fully_shard(model, mesh=mesh["dp"])
    else:
        model = parallelize_module(model, init_device_mesh("neuron", (n,)), plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank // 2 if SCENARIO == "fsdp_tp" else 0)
    losses: list[float] = []

    def body(_step: int) -> None:
        loss = model(torch.randn(16, 64, generator=data).to("neuron")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))

    profiled(3, body)
    with open(f"{OUT}.rank{rank}.json", "w") as f:
        json.dump(losses, f)


def zero(rank: int, n: int) -> None:
    import json

    import torch.nn as nn
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to("neuron"))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    data = torch.Generator().manual_seed(rank)

    def body(_step: int) -> None:
        model(torch.randn(32, 64, generator=data).to("neuron")).square().mean().backward()
        opt.step()
        opt.zero_grad()

    profiled(4, body)
    opt.consolidate_state_dict(to=0)
    if rank == 0:
        state = opt.state_dict()["state"]
        with open(f"{OUT}.rank0.json", "w") as f:
            json.dump({str(k): float(v["step"]) for k, v in state.items()}, f)


def main() -> None:
    dist.init_process_group("neuron")
    rank, n = dist.get_rank(), dist.get_world_size()
    {
        "pricing": pricing,
        "crash": ending,
        "kill": ending,
        "fsdp": fsdp,
        "straggler": straggler,
        "pipeline": pipeline,
        "tp": tensor_parallel,
        "fsdp_tp": tensor_parallel,
        "zero": zero,
    }[SCENARIO](rank, n)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

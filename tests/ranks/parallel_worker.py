"""One rank of tests/test_distributed.py: FSDP2 (`fully_shard`) and `torch.distributed.pipelining`
(GPipe and 1F1B over 2 stages) training.

Run under torchrun: `parallel_worker.py MODE OUT_DIR` where MODE is `gloo` (CPU tensors, the
reference) or `neuron` (neuron tensors, init_process_group("neuron")). Each rank writes
OUT_DIR/rank<N>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

import neuron_explorer.backend  # noqa: F401  (registers the device and the "neuron" backend)

MODE, OUT = sys.argv[1], Path(sys.argv[2])
DEV = "cpu" if MODE == "gloo" else "neuron"


def values(t: torch.Tensor) -> list:
    return t.detach().cpu().flatten().tolist()


def fsdp2(n: int) -> dict:
    """An MLP with each Linear and the whole model sharded, three SGD steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(DEV, (n,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(DEV)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + dist.get_rank())
    losses = []
    for _ in range(3):
        loss = model(torch.randn(4, 8).to(DEV)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": [values(p.full_tensor()) for p in model.parameters()]}


def pipeline(rank: int, n: int, schedule: str) -> dict:
    """A 4-layer MLP cut into one stage per rank, 4 micro-batches, two SGD steps."""
    from torch.distributed import pipelining

    torch.manual_seed(0)
    full = nn.Sequential(
        nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4)
    )
    per = len(full) // n + 1
    part = full[rank * per : (rank + 1) * per].to(DEV)
    stage = pipelining.PipelineStage(part, rank, n, torch.device(DEV))
    kind = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule]
    sched = kind(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=0.1)
    torch.manual_seed(1)
    losses = []
    for _ in range(2):
        x, y = torch.randn(8, 8).to(DEV), torch.randn(8, 4).to(DEV)
        mine: list = []
        if rank == 0:
            sched.step(x)
        elif rank == n - 1:
            sched.step(target=y, losses=mine)
        else:
            sched.step()
        opt.step()
        opt.zero_grad()
        losses.append([float(v) for v in mine])
    return {"losses": losses, "weights": [values(p) for p in part.parameters()]}


def main() -> None:
    dist.init_process_group("gloo" if MODE == "gloo" else "neuron")
    rank, n = dist.get_rank(), dist.get_world_size()
    result = {
        "fsdp2": fsdp2(n),
        "gpipe": pipeline(rank, n, "gpipe"),
        "1f1b": pipeline(rank, n, "1f1b"),
    }
    (OUT / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

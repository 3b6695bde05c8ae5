"""One rank of tests/test_distributed.py: every collective, DDP and tensor-parallel training, and
(but for `mixed`) FSDP2 and 2-stage pipelining from parallel_worker.py.

Run under torchrun: `collectives_worker.py MODE OUT_DIR` where MODE is `gloo` (CPU tensors, the
reference), `neuron` (neuron tensors, init_process_group("neuron")) or `mixed` (neuron tensors,
backend="cpu:gloo,neuron:neuron"). Each rank writes OUT_DIR/rank<N>.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import neuron_explorer.backend  # noqa: F401  (registers the device and the "neuron" backend)

MODE, OUT = sys.argv[1], Path(sys.argv[2])
BACKEND = {"gloo": "gloo", "neuron": "neuron", "mixed": "cpu:gloo,neuron:neuron"}[MODE]
DEV = "cpu" if MODE == "gloo" else "neuron"


def values(t: torch.Tensor) -> list:
    return t.detach().cpu().flatten().tolist()


def collectives(rank: int, n: int) -> dict:
    out: dict = {}
    x = torch.arange(4.0, device=DEV) + rank
    dist.all_reduce(x)
    out["all_reduce_sum"] = values(x)
    x = torch.arange(4.0, device=DEV) * (rank + 1)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    out["all_reduce_avg"] = values(x)
    x = torch.tensor([float(rank), -float(rank)], device=DEV)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = values(x)
    parts = [torch.zeros(3, device=DEV) for _ in range(n)]
    dist.all_gather(parts, torch.full((3,), rank + 0.5, device=DEV))
    out["all_gather"] = [values(p) for p in parts]
    whole = torch.zeros(2 * n, device=DEV)
    dist.all_gather_into_tensor(whole, torch.full((2,), float(rank), device=DEV))
    out["all_gather_into_tensor"] = values(whole)
    mine = torch.zeros(2, device=DEV)
    dist.reduce_scatter_tensor(mine, torch.arange(2.0 * n, device=DEV) * (rank + 1))
    out["reduce_scatter_tensor"] = values(mine)
    mine = torch.zeros(2, device=DEV)
    dist.reduce_scatter(mine, [torch.full((2,), float(rank + i), device=DEV) for i in range(n)])
    out["reduce_scatter"] = values(mine)
    b = torch.full((3,), float(rank), device=DEV)
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = values(b)
    a2a = torch.zeros(n, device=DEV)
    dist.all_to_all_single(a2a, torch.arange(float(n), device=DEV) + 10 * rank)
    out["all_to_all_single"] = values(a2a)
    t = torch.full((2,), float(rank + 1), device=DEV)
    if rank % 2 == 0 and rank + 1 < n:
        dist.send(t * 7, dst=rank + 1)
    elif rank % 2 == 1:
        dist.recv(t, src=rank - 1)
    out["send_recv"] = values(t)
    work = dist.all_reduce(torch.ones(2, device=DEV) * rank, async_op=True)
    work.wait()
    handle_t = torch.ones(2, device=DEV) * (rank + 2)
    dist.all_reduce(handle_t, async_op=True).wait()
    out["async_all_reduce"] = values(handle_t)
    objs: list = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
    out["all_gather_object"] = objs
    box = [{"from": rank}] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    out["broadcast_object_list"] = box
    dist.barrier()
    return out


def ddp_training(rank: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(DEV)
    ddp = DDP(model, bucket_cap_mb=0.0005)  # several gradient buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)
    losses = []
    for _step in range(3):
        xs, ys = torch.randn(2, 5, 8), torch.randn(2, 5, 4)
        with ddp.no_sync():  # gradient accumulation: the first micro-batch stays local
            nn.functional.mse_loss(ddp(xs[0].to(DEV)), ys[0].to(DEV)).backward()
        loss = nn.functional.mse_loss(ddp(xs[1].to(DEV)), ys[1].to(DEV))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": [values(p) for p in model.parameters()]}


def tensor_parallel(n: int) -> dict:
    """An MLP split column- then row-wise over a 1-D mesh (4 ranks: the tp dim of a 2 x 2 mesh,
    data parallel over the other), two SGD steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if n == 4:
        mesh = init_device_mesh(DEV, (2, 2), mesh_dim_names=("dp", "tp"))
        tp = mesh["tp"]
    else:
        tp = init_device_mesh(DEV, (n,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(DEV)
    model = parallelize_module(model, tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1)
    losses = []
    for _ in range(2):
        loss = model(torch.randn(4, 8).to(DEV)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": [values(p.full_tensor()) for p in model.parameters()]}


def main() -> None:
    dist.init_process_group(BACKEND)
    rank, n = dist.get_rank(), dist.get_world_size()
    result = {
        "collectives": collectives(rank, n),
        "ddp": ddp_training(rank),
        "tensor_parallel": tensor_parallel(n),
    }
    if MODE != "mixed":  # FSDP2 and pipelining in the same processes (one launch fewer each)
        import parallel_worker  # tests/ranks/, the script's own directory

        result["fsdp2"] = parallel_worker.fsdp2(n)
        if n == 2:
            result["gpipe"] = parallel_worker.pipeline(rank, n, "gpipe")
            result["1f1b"] = parallel_worker.pipeline(rank, n, "1f1b")
    (OUT / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A plain gloo FSDP2 program of CPU tensors that never names the neuron device, with no mesh
given: with the package installed (and its autoload on) it must train as without it.

Usage: plain_fsdp2_worker.py OUT_PREFIX (writes OUT_PREFIX.rankN.json: the losses and the
default mesh's device type).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(3):
        loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    out = {
        "losses": losses,
        "mesh": model[0].weight.device_mesh.device_type,
        "registered": torch._C._get_privateuse1_backend_name() == "neuron",
    }
    with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:
        json.dump(out, f)
    # Every rank's gloo work done, then the process ends without tearing gloo down: torch's
    # own teardown of this program, with the package NOT loaded, aborted a rank twice in CI
    # ("terminate called without an active exception"; once more after a barrier: abort, then
    # SIGSEGV). What this worker compares is training and the mesh, not torch's teardown; the
    # package's own exits are those of every other distributed test.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

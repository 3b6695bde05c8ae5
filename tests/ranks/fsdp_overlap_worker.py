"""One rank of tests/test_distributed.py: FSDP2 (`fully_shard`) training whose all-gathers and
reduce-scatters overlap compute.

`fsdp_overlap_worker.py MODE OUT SLOW_RANK SLEEP_S`: an MLP of 4 Linear(1024, 1024) layers,
each and the whole model sharded, 3 SGD steps on 512 rows. MODE `neuron` trains on the neuron
device under `neuron_explorer.trace_handler(OUT)` (the last 2 steps recorded); MODE `gloo`
trains the same on CPU tensors over gloo. Rank SLOW_RANK sleeps SLEEP_S before each forward and
before the last layer's backward, so the other rank's first all-gather of the step and the
last layer's reduce-scatter wait for it. Each rank writes its losses and final weights to
OUT.rank<N>.json.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import neuron_explorer

MODE, OUT, SLOW, SLEEP = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
DEV = "neuron" if MODE == "neuron" else "cpu"
WIDTH, ROWS, LAYERS = 1024, 512, 4


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("neuron" if MODE == "neuron" else "gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(DEV, (n,))
    torch.manual_seed(0)
    layers = [m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.ReLU())]
    model = nn.Sequential(*layers).to(DEV)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if rank == SLOW:  # before the last layer's backward: its reduce-scatter is late
        model[-2].register_full_backward_pre_hook(lambda *_: time.sleep(SLEEP))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)
    batches = [torch.randn(ROWS, WIDTH) for _ in range(3)]
    losses = []

    def step(x: torch.Tensor) -> None:
        if rank == SLOW:
            time.sleep(SLEEP)
        loss = model(x.to(DEV)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())

    if MODE == "neuron":
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
            on_trace_ready=neuron_explorer.trace_handler(OUT),
        ) as prof:
            for x in batches:
                step(x)
                prof.step()
    else:
        for x in batches:
            step(x)
    weights = [p.full_tensor().cpu().flatten()[:64].tolist() for p in model.parameters()]
    with open(f"{OUT}.rank{rank}.json", "w") as f:
        json.dump({"losses": losses, "weights": weights}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One rank of tests/test_device_shapes_only.py: a model too big for one chip's HBM, trained in
shapes-only mode, whole on one rank or sharded with FSDP2 over the job's ranks.

`shapes_fsdp_worker.py OUT [fsdp]`: 24 Linear(16384, 16384) layers (6.4 billion parameters:
parameters, gradients and AdamW state need 16 bytes each, 96 GiB, with the activations past
trn2's 96 GiB chip), two AdamW steps on 2048 rows, the second recorded under
`neuron_explorer.trace_handler(OUT)`.
With `fsdp` (under torchrun) each layer and the model are `fully_shard`ed over the ranks.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import neuron_explorer
from neuron_explorer import backend

OUT = sys.argv[1]
FSDP = sys.argv[2:] == ["fsdp"]
WIDTH, ROWS, LAYERS = 16384, 2048, 24


def main() -> None:
    backend.set_device_spec("trn2")
    if FSDP:
        dist.init_process_group("neuron")
    with neuron_explorer.shapes_only(), torch.device("neuron"):
        model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
        if FSDP:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("neuron", (dist.get_world_size(),))
            for layer in model:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(ROWS, WIDTH)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(wait=1, warmup=0, active=1, repeat=1),
            on_trace_ready=neuron_explorer.trace_handler(OUT),
        ) as prof:
            for _ in range(2):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    if FSDP:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

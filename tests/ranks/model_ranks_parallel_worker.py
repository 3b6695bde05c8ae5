"""A job run under `neuron-explorer capture --model-ranks N` by tests/test_model_ranks.py, in
shapes-only mode: `tp` shards an MLP with DTensor tensor parallelism (ColwiseParallel then
RowwiseParallel) over the job's ranks and takes three AdamW steps; `pp KIND` runs a schedule of
torch.distributed.pipelining (`gpipe`, `1f1b`, `interleaved`), modeled or under a real
torchrun; `ppdp KIND DP` runs it on a 2-D mesh, each stage sharded with FSDP2 over DP
ranks; `decode` shards a two-layer Llama the same way and runs its decode step compiled,
with a static KV cache."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn as nn


def tensor_parallel() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    with torch.device("neuron"):
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    for _ in range(3):
        model(torch.randn(32, 256, device="neuron")).square().mean().backward()
        opt.step()
        opt.zero_grad()
    print("tp local weight", tuple(model[0].weight.to_local().shape))


def compiled_decode() -> None:
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512,
    )  # fmt: skip
    plan = {}
    for i in range(config.num_hidden_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        plan.update({f"{attn}.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")})
        plan.update({f"{mlp}.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")})
        plan[f"{attn}.o_proj"] = plan[f"{mlp}.down_proj"] = RowwiseParallel()
    with torch.no_grad():
        with torch.device("neuron"):
            model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
            parallelize_module(model, mesh, plan)
            cache = transformers.StaticCache(config=config, max_cache_len=512)
        token = torch.zeros(1, 1, dtype=torch.long).to("neuron")
        position = torch.tensor([[300]]).to("neuron")
        step = torch.compile(model, backend="neuron", dynamic=False)
        for _ in range(3):  # compiles, compiles again once the cache holds tensors, runs
            step(input_ids=token, cache=cache, position_ids=position, use_cache=True)
        torch.neuron.synchronize()


def pipeline(kind: str) -> None:
    """One stage a rank of four Linear(4096, 4096) + Tanh layers, 4 micro-batches of 1024 rows,
    three steps: device-bound (each micro-batch's forward is milliseconds of modeled TensorE
    work, far above the host's launches), so the bubble is the modeled device's, not the host's
    noise. `interleaved`: two stages a rank (ScheduleInterleaved1F1B), which a modeled job
    cannot run."""
    from torch.distributed import pipelining

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron")

    def part() -> nn.Module:
        layers = [m for _ in range(4) for m in (nn.Linear(4096, 4096), nn.Tanh())]
        return nn.Sequential(*layers).to(device)

    if kind == "interleaved":
        stages = [pipelining.PipelineStage(part(), s, 2 * world, device)
                  for s in (rank, rank + world)]  # fmt: skip
        params = [p for s in stages for p in s.submod.parameters()]
        schedule = pipelining.ScheduleInterleaved1F1B(stages, 4, loss_fn=nn.functional.mse_loss)
        first, last = rank == 0, rank == world - 1
    else:
        stage = pipelining.PipelineStage(part(), rank, world, device)
        params = list(stage.submod.parameters())
        schedules = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}
        schedule = schedules[kind](stage, 4, loss_fn=nn.functional.mse_loss)
        first, last = rank == 0, rank == world - 1
    opt = torch.optim.SGD(params, lr=0.01)
    for _ in range(3):
        x = torch.randn(4096, 4096, device=device)
        target = torch.randn(4096, 4096, device=device)
        if first:
            schedule.step(x)
        elif last:
            schedule.step(target=target)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()


def sharded_pipeline(kind: str, dp: int) -> None:
    """The pipeline of `pipeline` on a 2-D mesh (pp x dp): each stage's module sharded with
    FSDP2 over its `dp` ranks, the stages over the pp ranks (rank 0: stage 0, sharded with
    rank 1). `mixed`: bf16 parameters, float32 gradient reduction (FSDP2 then accumulates its
    micro-batches' gradients in float32 copies)."""
    from torch.distributed import pipelining
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    world, device = dist.get_world_size(), torch.device("neuron")
    mesh = init_device_mesh("neuron", (world // dp, dp), mesh_dim_names=("pp", "dp"))
    pp_rank, pp = mesh["pp"].get_local_rank(), world // dp
    policy = MixedPrecisionPolicy()
    if kind.endswith("-mixed"):
        kind, policy = (
            kind.removesuffix("-mixed"),
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        )
    layers = [m for _ in range(4) for m in (nn.Linear(4096, 4096), nn.Tanh())]
    module = fully_shard(nn.Sequential(*layers).to(device), mesh=mesh["dp"], mp_policy=policy)
    stage = pipelining.PipelineStage(module, pp_rank, pp, device, group=mesh["pp"].get_group())
    schedules = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}
    schedule = schedules[kind](stage, 4, loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    for _ in range(3):
        x = torch.randn(4096, 4096, device=device)
        target = torch.randn(4096, 4096, device=device)
        if pp_rank == 0:
            schedule.step(x)
        elif pp_rank == pp - 1:
            schedule.step(target=target)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()


def main() -> None:
    dist.init_process_group("neuron")
    if sys.argv[1] == "tp":
        tensor_parallel()
    elif sys.argv[1] == "decode":
        compiled_decode()
    elif sys.argv[1] == "ppdp":
        sharded_pipeline(sys.argv[2], int(sys.argv[3]))
    else:
        pipeline(sys.argv[2])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

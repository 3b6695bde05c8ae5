"""One rank of a shapes-only Llama-3-8B job (tests/test_device_shapes_only.py's many-rank
sweep, docs/device.md "How many real ranks one machine holds"): the model from its public
config (Transformers' `from_config` under `torch.device("neuron")`, no weights), each decoder
layer and the model `fully_shard`ed over the job's ranks with FSDP2, one AdamW step of
`ROWS x SEQ` tokens under bf16 autocast, then `STEPS - 1` more.

Run under `neuron-explorer capture -o DIR -- torchrun --nproc-per-node N
shapes_llama_fsdp_worker.py [LAYERS]` with NEURON_EXPLORER_SHAPES_ONLY=1. Each rank prints its
peak RSS (`ru_maxrss`) on its last line."""

from __future__ import annotations

import resource
import sys
import warnings

import torch
import torch.distributed as dist

# meta-llama/Meta-Llama-3-8B, config.json (huggingface.co/meta-llama/Meta-Llama-3-8B)
LLAMA3_8B = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
)  # fmt: skip
ROWS, SEQ, STEPS = 1, 2048, 2


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    warnings.filterwarnings("ignore", message="neuron: shapes-only mode")
    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    config = LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": layers})
    with torch.device("neuron"):
        model = LlamaForCausalLM(config)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    for _ in range(STEPS):
        tokens = torch.randint(0, config.vocab_size, (ROWS, SEQ), device="neuron")
        with torch.autocast("neuron", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"rank {dist.get_rank()} peak rss {peak_kib // 1024} MiB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

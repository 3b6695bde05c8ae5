"""A Llama-3-8B training step on trn2 in shapes-only mode: the full-size model on this host.

Tensors carry shapes, dtypes and strides but no data (docs/device.md, "Shapes-only mode"), so
the 8-billion-parameter model (Meta-Llama-3-8B's public config.json) is built, run forward and
backward under bf16 autocast and stepped by AdamW with fp32 master weights in seconds and
about 1 GB of host memory, and profiled with the same kernels and modeled times as a real run.
Known problem for the analysis: the step does not fit one trn2 chip's 96 GiB of HBM
(parameters, gradients and AdamW state alone are 16 bytes a parameter): hbm-capacity.
What it cannot tell: numerics (the loss printed is a placeholder).
"""

from __future__ import annotations

import warnings

import torch
from models import sample_args

import neuron_explorer
from neuron_explorer import backend

# meta-llama/Meta-Llama-3-8B, config.json (huggingface.co/meta-llama/Meta-Llama-3-8B)
LLAMA3_8B = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
)  # fmt: skip


def main() -> None:
    args = sample_args(__doc__.splitlines()[0], steps=2, batch=1, seq=2048, layers=32)
    from transformers import LlamaConfig, LlamaForCausalLM

    backend.set_device_spec("trn2")
    config = LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": args.layers})
    # one warning per line for the placeholder values (the loss) is all this sample expects
    warnings.filterwarnings("ignore", message="neuron: shapes-only mode")
    with neuron_explorer.shapes_only(), torch.device("neuron"):
        model = LlamaForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        # the step ends when the device does: a sync in the optimizer's own post-step hook runs
        # before the capture's (which ends the step), so the step's time is the device's
        optimizer.register_step_post_hook(lambda *_: torch.neuron.synchronize())
        for _ in range(args.steps):
            tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq))
            with torch.autocast("neuron", dtype=torch.bfloat16):
                loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in model.parameters())
    peak = torch.neuron.max_memory_allocated()
    print(f"llama8b_shapes: {params / 1e9:.2f}B parameters, {args.steps} steps, device memory "
          f"peak {peak / 2**30:.1f} GiB (trn2: 96 GiB per chip)")  # fmt: skip


if __name__ == "__main__":
    main()

"""Full-size fidelity points (issue 25): AWS's published trn1 figures beside the modeled device
time of the same work, run in shapes-only mode with `--model-ranks`-style modeled groups, so an
8B-class model and a 32-rank job run on this 2-core machine. Meant for benchmarks/fidelity.py's
table (its `Point`: a published time and a `run()` giving the modeled device ns and the floor
the chip's peaks allow).

    python benchmarks/fidelity_full_size.py

Each point counts device time as the eager device queue runs it: the kernels' busy time plus
the collectives the step waits for; the gaps an eager host leaves between launches are left out
(Neuron runs these models as compiled graphs, whose launches do not wait on Python). Goal: within
25% of the published figure.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import Point  # noqa: E402 - the table's own point (benchmarks/ is not a package)

TP = 32  # Llama-2-7B decode: tensor parallel over the 32 NeuronCores of a trn1.32xlarge


def _device_ns(fn: Callable[[], object]) -> tuple[int, int]:
    """(kernel busy + collective ns, floor ns) of the device work `fn` launches."""
    import torch

    from neuron_explorer import backend

    backend.events.clear()
    with torch.profiler.profile():
        fn()
        torch.neuron.synchronize()
    events = [e for e in backend.events.drain() if e.kind in ("kernel", "collective")]
    busy = sum(e.device_dur_ns or 0 for e in events)
    spec = backend.runtime.model.spec()
    kernels = [e for e in events if e.kind == "kernel"]
    flops = sum(k.flops for k in kernels)
    moved = sum(k.bytes_read + k.bytes_written for k in kernels)
    floor = max(flops / spec.peak_flops_bf16, moved / spec.memory_bytes_per_s) * 1e9
    return busy, round(floor)


def llama2_7b_decode() -> tuple[int, int]:
    """One output token of Llama-2-7B after 128 tokens in, batch 1, bf16, TP=32 (DTensor
    colwise/rowwise over 32 modeled ranks)."""
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    import neuron_explorer
    from neuron_explorer import backend
    from neuron_explorer.backend import model_ranks

    model_ranks.enable(TP)
    backend.set_device_spec("trn1")
    if not dist.is_initialized():
        dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (TP,))
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
    )  # fmt: skip
    plan: dict = {}
    for i in range(config.num_hidden_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        plan.update({f"{attn}.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")})
        plan.update({f"{mlp}.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")})
        plan[f"{attn}.o_proj"] = plan[f"{mlp}.down_proj"] = RowwiseParallel()
    with neuron_explorer.shapes_only(), torch.device("neuron"), torch.no_grad():
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        parallelize_module(model, mesh, plan)
        out = model(input_ids=torch.randint(0, 32000, (1, 128)), use_cache=True)
        token = torch.randint(0, 32000, (1, 1))
        cache = model(input_ids=token, past_key_values=out.past_key_values).past_key_values
        return _device_ns(lambda: model(input_ids=token, past_key_values=cache))


def bert_large_phase1() -> tuple[int, int]:
    """One rank's step of BERT-Large phase-1 pretraining, bf16, micro-batch 16, seq 128: one
    micro-batch's forward and backward, plus a 32nd of the optimizer step (AdamW) and of the
    gradients' all-reduce over 32 ranks (the AWS recipe accumulates 32 micro-batches a step)."""
    import torch
    import transformers

    import neuron_explorer
    from neuron_explorer import backend
    from neuron_explorer.backend.costmodel import collectives as cc

    backend.set_device_spec("trn1")
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, max_position_embeddings=512,
    )  # fmt: skip
    with neuron_explorer.shapes_only(), torch.device("neuron"):
        model = transformers.BertForPreTraining(config).to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        ids = torch.randint(0, 30522, (16, 128))
        labels, nsp = torch.randint(0, 30522, (16, 128)), torch.randint(0, 2, (16,))

        def micro() -> None:
            model(input_ids=ids, labels=labels, next_sentence_label=nsp).loss.backward()

        micro()
        opt.step()  # AdamW's state made before the measured step
        micro_ns, micro_floor = _device_ns(micro)
        opt_ns, opt_floor = _device_ns(opt.step)
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    spec = backend.runtime.model.spec()
    allreduce = cc.collective_cost(cc.ALL_REDUCE, grads, 32, spec.collectives).transfer_ns
    step = micro_ns + (opt_ns + allreduce) // 32
    # the published figure is sequences/s of 32 ranks: the time of 16 * 32 sequences
    return step, micro_floor + opt_floor // 32


_AWS = "AWS Neuron documentation, trn1 performance tables (as quoted in issue 25)"
POINTS = (
    Point("Llama-2-7B decode, TP=32, batch 1, 128 in (per output token, P50)", "trn1",
          6_700_000, _AWS, llama2_7b_decode, "transformers-neuronx inference"),
    Point("BERT-Large phase-1 pretraining, DP=32, micro-batch 16, seq 128, bf16 "
          "(3,826.61 sequences/s: one step of 512 sequences)", "trn1",
          round(16 * 32 / 3826.61 * 1e9), _AWS, bert_large_phase1, "HF BERT pretraining"),
)  # fmt: skip


def main() -> int:
    warnings.filterwarnings("ignore")
    print("| point | published ms | modeled ms | modeled / published | floor ms |")
    print("|---|---|---|---|---|")
    for p in POINTS:
        modeled, floor = p.run()
        print(f"| {p.name} | {p.published_ns / 1e6:.2f} | {modeled / 1e6:.2f} | "
              f"{modeled / p.published_ns:.2f} | {floor / 1e6:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

"""Where one shapes-only rank's memory goes: samples/llama8b_shapes.py's Llama-3-8B step (its
public config, LAYERS decoder layers, batch 1, seq 2048, bf16 autocast, AdamW) in this one
process, the second of two steps recorded by `neuron_explorer.profile`; RSS and PSS after each
phase, and the peak (docs/device.md, "How many real ranks one machine holds").

    python benchmarks/rank_memory_bench.py [LAYERS] [--instruction-limit N]
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def memory(phase: str) -> None:
    """Print this process's RSS and PSS now (smaps_rollup), in MiB."""
    gc.collect()
    kib = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key, *value = line.split()
        if key in ("Rss:", "Pss:"):
            kib[key[:-1]] = int(value[0])
    print(f"{phase:32s} RSS {kib['Rss'] >> 10:5d} MiB  PSS {kib['Pss'] >> 10:5d} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", type=int, nargs="?", default=32)
    parser.add_argument("--instruction-limit", type=int, default=None)
    args = parser.parse_args()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import neuron_explorer
    from neuron_explorer import backend
    from neuron_explorer.backend.runtime import events

    sys.path.insert(0, str(ROOT / "samples"))
    from llama8b_shapes import LLAMA3_8B

    memory("imports")
    if args.instruction_limit is not None:
        events.set_instruction_limit(args.instruction_limit)
    drain = events.drain

    def measured_drain():  # the capture's drain, after torch.profiler exported its trace
        drained = drain()
        memory(f"trace exported, {len(drained)} drained")
        return drained

    events.drain = measured_drain
    backend.set_device_spec("trn2")
    warnings.filterwarnings("ignore", message="neuron: shapes-only mode")
    config = LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": args.layers})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out, neuron_explorer.shapes_only():
        with torch.device("neuron"):
            model = LlamaForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        optimizer.register_step_post_hook(lambda *_: torch.neuron.synchronize())
        with neuron_explorer.profile(Path(out) / "p", wait=1, warmup=0, active=1) as prof:
            for step in range(2):
                tokens = torch.randint(0, config.vocab_size, (1, 2048), device="neuron")
                with torch.autocast("neuron", dtype=torch.bfloat16):
                    loss = model(input_ids=tokens, labels=tokens).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                memory(f"step {step} ({'recorded' if step else 'not recorded'})")
                prof.step()
        memory("profile written")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
    print(f"{args.layers} layers: {time.perf_counter() - t0:.1f} s, peak RSS {peak} MiB")


if __name__ == "__main__":
    main()

"""Shapes-only mode at full size: a Llama-3-8B training step (batch 1, seq 2048, bf16 autocast,
AdamW) captured with `neuron-explorer capture`, and a Llama-3-70B forward, each in a fresh
process: wall time, peak RSS of the process tree, the modeled device memory peak and the
profile's size.

    python benchmarks/shapes_only_bench.py [--skip-70b]

Goal (issue 25): the 8B step captured in under 60 s with under 3 GB RSS on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# meta-llama/Meta-Llama-3-70B's config.json (the 8B's is in samples/llama8b_shapes.py)
LLAMA3_70B = dict(
    vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
    num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
    rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
)  # fmt: skip

FORWARD_70B = f"""
import time, warnings, torch, transformers, neuron_explorer
warnings.filterwarnings("ignore", message="neuron: shapes-only mode")
t0 = time.perf_counter()
config = transformers.LlamaConfig(**{LLAMA3_70B!r})
with neuron_explorer.shapes_only(), torch.device("neuron"), torch.no_grad():
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    tokens = torch.randint(0, config.vocab_size, (1, 2048))
    with neuron_explorer.profile(OUT, wait=0, warmup=0, active=1) as prof:
        logits = model(input_ids=tokens).logits
        torch.neuron.synchronize()
        prof.step()
print("params", sum(p.numel() for p in model.parameters()))
print("peak_bytes", torch.neuron.max_memory_allocated())
"""


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, stdout) of one command in a fresh process: the RSS is the largest
    of that process and the descendants it waited for (wait4's rusage)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=ROOT)
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{err.read()[-3000:]}")
        return wall, usage.ru_maxrss / 1024, out.read()


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-70b", action="store_true", help="only the 8B training step")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="shapes-bench-") as tmp:
        out = Path(tmp) / "llama8b"
        cmd = [sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out), "--wait", "1",
               "--warmup", "0", "--active", "1", "--", "python",
               str(ROOT / "samples" / "llama8b_shapes.py"), "--steps", "2"]  # fmt: skip
        wall, rss, stdout = _run(cmd, env)
        extra = json.loads((out / "manifest.json").read_text())["extra"]
        peak = extra["device_memory"]["peak_bytes"]
        rows.append(("Llama-3-8B training step, 2 steps, 1 captured", wall, rss, peak,
                     _size_mb(out)))  # fmt: skip
        if not args.skip_70b:
            out70 = Path(tmp) / "llama70b"
            script = f"OUT = {str(out70)!r}\n" + FORWARD_70B
            wall, rss, stdout = _run([sys.executable, "-c", script], env)
            peak = int(stdout.split("peak_bytes")[1].split()[0])
            rows.append(("Llama-3-70B forward, bf16, captured", wall, rss, peak, _size_mb(out70)))
    print("| run | wall s | peak RSS MB | device peak GiB | profile MB |")
    print("|---|---|---|---|---|")
    for name, wall, rss, peak, size in rows:
        print(f"| {name} | {wall:.1f} | {rss:.0f} | {peak / 2**30:.1f} | {size:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

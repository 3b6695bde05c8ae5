"""Capture every sample into samples/profiles/NAME, so `neuron-explorer serve samples/profiles`
works right after install. Rerun after changing a sample, the device or the capture:

    python samples/make_profiles.py [NAME ...]

Each sample runs in its own process (a fresh device: eager compiles and caches start empty),
with small step counts so the committed profiles stay a few MB in all.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "profiles"

# sample -> its arguments; a capture records steps 2-4 (--wait 1 --warmup 1 --active 3) unless
# CAPTURE_OF says otherwise
SAMPLES: dict[str, list[str]] = {
    "gpt_train": ["--steps", "6"],
    "gpt_compile": ["--steps", "6", "--switch-at", "3"],  # the recompile lands in step 3
    "cnn_dataloader": ["--steps", "6"],
    "fallback_float64": ["--steps", "6"],
    "ddp_straggler": ["--steps", "6"],  # two ranks under torchrun (LAUNCH below)
    "pipeline_imbalance": ["--steps", "6"],  # two pipeline stages, one holding most blocks
    "pipeline_balanced": ["--steps", "6", "--balanced"],  # the same, four blocks a stage
    "llama8b_shapes": ["--steps", "2"],  # shapes-only: a full-size Llama-3-8B step on trn2
}
# profiles of a script under another name: profile -> the script's name
SCRIPT = {"pipeline_balanced": "pipeline_imbalance"}
# samples that run as a torchrun job: the launcher's options, before the script
_TWO_RANKS = ["torchrun", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
LAUNCH = dict.fromkeys(("ddp_straggler", "pipeline_imbalance", "pipeline_balanced"), _TWO_RANKS)
CAPTURE = ["--wait", "1", "--warmup", "1", "--active", "3"]
# samples whose steps are large: one recorded step (the second) is the profile
CAPTURE_OF = {"llama8b_shapes": ["--wait", "1", "--warmup", "0", "--active", "1"]}


def capture(name: str) -> int:
    """Capture one sample with the neuron-explorer CLI into samples/profiles/NAME."""
    sample_args = SAMPLES[name]
    out = OUT / name
    if out.exists():
        shutil.rmtree(out)
    launcher = [*LAUNCH[name], f"--master-port={_free_port()}"] if name in LAUNCH else ["python"]
    command = [sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out), *CAPTURE_OF.get(name, CAPTURE),
               "--", *launcher, str(HERE / f"{SCRIPT.get(name, name)}.py"), *sample_args]  # fmt: skip
    print("$", " ".join(command[1:]), flush=True)
    status = subprocess.call(command, cwd=ROOT)
    if status == 0:  # committed profiles name files relative to the repository, never /home/...
        from neuron_explorer.capture.relocate import relativize

        relativize(out, ROOT)
    return status


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[[], *SAMPLES], help="samples (default all)")
    names = parser.parse_args().names or list(SAMPLES)
    failed = [n for n in names if capture(n) != 0]
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"samples/profiles: {size / 1e6:.1f} MB", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`neuron-explorer capture -o DIR -- torchrun ... train.py`: every rank captured, one profile.

torchrun starts the ranks as child processes, so capture cannot run the script in its own
process. Instead the launch is rewritten to have torchrun start, in each rank, this same capture
of the training script (`torchrun OPTS --no-python PYTHON -m neuron_explorer capture -o DIR
[schedule] -- python train.py ARGS`); each rank writes its part and the last one assembles the
job's profile (model/combine.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ExplorerError

LAUNCHERS = ("torchrun",)
LAUNCHER_MODULE = "torch.distributed.run"


def is_launch(command: Sequence[str]) -> bool:
    """True for `torchrun ...` and `python -m torch.distributed.run ...`."""
    if command and Path(command[0]).name in LAUNCHERS:
        return True
    args = list(command)
    if args and Path(args[0]).name.startswith("python"):
        args = args[1:]
    return len(args) >= 2 and args[0] == "-m" and args[1] == LAUNCHER_MODULE


def rewrite(command: Sequence[str], capture_args: Sequence[str]) -> list[str]:
    """The launch with each rank running `capture CAPTURE_ARGS -- python SCRIPT ARGS`."""
    from torch.distributed.run import get_args_parser

    args = list(command)
    head = 1 if Path(args[0]).name in LAUNCHERS else args.index(LAUNCHER_MODULE) + 1
    options = args[head:]
    try:
        parsed = get_args_parser().parse_args(options)
    except SystemExit as e:
        raise ExplorerError(f"capture: torchrun cannot parse {' '.join(options)}") from e
    if parsed.no_python:
        raise ExplorerError("capture: torchrun --no-python is not supported (give it a script)")
    script_at = len(options) - len(parsed.training_script_args) - 1
    torchrun_options = options[:script_at]
    target = ["-m", parsed.training_script] if parsed.module else [parsed.training_script]
    torchrun_options = [o for o in torchrun_options if o not in ("-m", "--module")]
    return [
        sys.executable, "-m", LAUNCHER_MODULE, *torchrun_options, "--no-python",
        sys.executable, "-m", "neuron_explorer", "capture", *capture_args,
        "--", "python", *target, *parsed.training_script_args,
    ]  # fmt: skip

"""`neuron-explorer capture -o DIR -- python script.py ARGS`: profile a script, unchanged."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "capture"
HELP = (
    "Run a Python script under the profiler with no change to it and write a profile "
    "(steps from optimizer.step() or the script's own prof.step())."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", required=True, help="profile directory to write")
    parser.add_argument("--wait", type=int, default=1, help="steps to skip first (default 1)")
    parser.add_argument("--warmup", type=int, default=1, help="profiler warm-up steps (default 1)")
    parser.add_argument("--active", type=int, default=3, help="steps to record (default 3)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="cycles to record; later ones go to OUTPUT.cycleN"
    )
    parser.add_argument(
        "--model-ranks",
        type=int,
        default=0,
        metavar="N",
        help="model a job of N identical ranks from this one process: rank 0 runs, the "
        "collectives are priced for groups of N (pair with NEURON_EXPLORER_SHAPES_ONLY=1)",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="after --: python SCRIPT ARGS (or python -m MODULE ARGS, or torchrun ... SCRIPT ARGS)",
    )


def run(args: argparse.Namespace) -> int:
    from ...errors import ExplorerError

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.wait < 0 or args.warmup < 0 or args.active < 1 or args.repeat < 1:
        raise ExplorerError(
            "capture: need --wait >= 0, --warmup >= 0, --active >= 1, --repeat >= 1"
        )
    from ...capture import torchrun

    if args.model_ranks:
        if torchrun.is_launch(command):
            raise ExplorerError("capture: --model-ranks runs one process; drop torchrun")
        from ...backend import model_ranks

        model_ranks.enable(args.model_ranks)
    if torchrun.is_launch(command):  # every rank captures itself; one profile for the job
        import subprocess

        schedule_args = [f"--wait={args.wait}", f"--warmup={args.warmup}",
                         f"--active={args.active}", f"--repeat={args.repeat}"]  # fmt: skip
        out = ["-o", str(Path(args.output).resolve())]
        return subprocess.call(torchrun.rewrite(command, [*out, *schedule_args]))
    from ...capture.runner import Schedule, run_captured

    schedule = Schedule(args.wait, args.warmup, args.active, args.repeat)
    result = run_captured(command, args.output, schedule)
    if not result.profiles:
        print("neuron-explorer: nothing was recorded (no profile written)", file=sys.stderr)
    return result.exit_code

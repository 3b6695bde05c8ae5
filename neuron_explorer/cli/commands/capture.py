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
    from ...backend.costmodel.spec import get_spec

    try:  # the chip and its LNC from the environment, refused here rather than mid-run
        get_spec()
    except ValueError as e:
        raise ExplorerError(f"capture: {e}") from None
    from ...capture import torchrun

    schedule_args = [f"--wait={args.wait}", f"--warmup={args.warmup}",
                     f"--active={args.active}", f"--repeat={args.repeat}"]  # fmt: skip
    if args.model_ranks and torchrun.is_launch(command):
        raise ExplorerError("capture: --model-ranks runs one process; drop torchrun")
    other = _other_python(command)
    if other is not None:  # the script runs under the interpreter it names, as without capture
        import subprocess

        out = ["-o", str(Path(args.output).resolve())]
        ranks = [f"--model-ranks={args.model_ranks}"] if args.model_ranks else []
        again = [other, "-m", "neuron_explorer", NAME, *out, *schedule_args, *ranks, "--",
                 *command[1:]]  # fmt: skip
        return subprocess.call(again)
    if args.model_ranks:
        from ...backend import model_ranks

        model_ranks.enable(args.model_ranks)
    if torchrun.is_launch(command):  # every rank captures itself; one profile for the job
        import subprocess

        from ...model import rank_parts

        output = Path(args.output).resolve()
        code = subprocess.call(torchrun.rewrite(command, ["-o", str(output), *schedule_args]))
        # a rank that died after the others had gone left its job's parts unassembled
        rank_parts.settle(output)
        return code
    from ...capture.runner import Schedule, run_captured

    schedule = Schedule(args.wait, args.warmup, args.active, args.repeat)
    result = run_captured(command, args.output, schedule)
    if not result.profiles:
        print("neuron-explorer: nothing was recorded (no profile written)", file=sys.stderr)
    return result.exit_code


def _other_python(command: list[str]) -> str | None:
    """The interpreter a command names by path (`/opt/env/bin/python script.py`) when it is not
    this one's environment; None for a bare `python` (run here, as before) or a script."""
    import os
    import subprocess

    from ...errors import ExplorerError

    first = command[0] if command else ""
    if os.sep not in first or not Path(first).name.startswith("python") or first.endswith(".py"):
        return None
    if not (os.path.isfile(first) and os.access(first, os.X_OK)):
        raise ExplorerError(f"{first}: no such interpreter")
    if os.path.abspath(first) == os.path.abspath(sys.executable):
        return None
    # the package and what capture imports (a PYTHONPATH can show the package without them)
    probe = (
        "import sys, importlib.util as u; print(sys.prefix); "
        "print(all(u.find_spec(m) for m in ('neuron_explorer', 'torch', 'pyarrow')))"
    )
    try:
        found = subprocess.run([first, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ExplorerError(f"{first}: cannot run this interpreter ({e})") from None
    lines = found.stdout.split()
    if found.returncode != 0 or len(lines) != 2:
        raise ExplorerError(f"{first}: cannot run this interpreter (exit {found.returncode})")
    if os.path.realpath(lines[0]) == os.path.realpath(sys.prefix):
        return None
    if lines[1] != "True":
        raise ExplorerError(
            f"{first}: neuron_explorer is not installed for this interpreter, or not with its "
            "dependencies (torch, pyarrow): install it there, or name this one"
        )
    return first

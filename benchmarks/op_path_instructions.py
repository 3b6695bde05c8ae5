"""The neuron op path per call in CPU instructions (valgrind callgrind): a figure load cannot move.

op_path_bench.py times the same calls, but on a shared machine its microseconds move by 10-60%
between processes, more than the 1-2 us a change to the recorded path makes. Instructions
executed per call do not depend on the load: this script runs each op in a loop under callgrind,
collecting only inside the loop (`--toggle-collect=functools_reduce`: the loop is one
`functools.reduce` call), after a warm-up that compiles the kernel and fits the host clock.

Run: .venv/bin/python benchmarks/op_path_instructions.py REV_OR_DIR... [--ops add_,mm,view]
Each argument is a git revision (its `neuron_explorer` is exported to a temporary directory) or a
directory holding a `neuron_explorer` package. Needs `valgrind` (Debian: apt-get install
valgrind); about 2-4 minutes per (tree, op, profiler) on this machine, two at a time.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
N = 400  # calls collected; the warm-up runs 300 first
LOOP = """
import functools, sys, warnings
warnings.simplefilter("ignore")
import torch, neuron_explorer
from neuron_explorer.backend import events
torch.set_num_threads(1)
x, y = torch.zeros(16, device="neuron"), torch.ones(16, device="neuron")
a, b = torch.randn(16, 16, device="neuron"), torch.randn(16, 16, device="neuron")
ops = {"add_": lambda: x.add_(y), "mm": lambda: torch.mm(a, b), "view": lambda: x.view(-1)}
f, n, on = ops[sys.argv[1]], int(sys.argv[2]), sys.argv[3] == "on"
def step(acc, _):
    f()
    return acc
import os, subprocess
# instrument from here on (the imports above ran uninstrumented: twice as fast)
subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
if on:
    prof.start()
for _ in range(300):
    f()
events.clear()
functools.reduce(step, range(n), 0)
if on:
    prof.stop()
"""


def tree(arg: str, tmp: Path) -> Path:
    """A directory holding `neuron_explorer`: the argument itself, or a revision exported."""
    path = Path(arg)
    if (path / "neuron_explorer").is_dir():
        return path
    out = tmp / re.sub(r"[^\w.-]", "_", arg)
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", arg, "neuron_explorer"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def instructions(src: Path, script: Path, op: str, profiler: str) -> int:
    """Instructions per call of `op` with the profiler on or off, `src`'s package first."""
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
           "--toggle-collect=functools_reduce", "--callgrind-out-file=/dev/null",
           sys.executable, str(script), op, str(N), profiler]  # fmt: skip
    run = subprocess.run(cmd, capture_output=True, text=True, env={"PYTHONPATH": str(src),
                         "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})  # fmt: skip
    found = re.search(r"Collected : (\d+)", run.stderr)
    if not found:
        raise SystemExit(
            f"{src}: callgrind printed no count for {op} {profiler}: {run.stderr[-300:]}"
        )
    return int(found.group(1)) // N


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "trees", nargs="+", help="git revisions or directories with neuron_explorer"
    )
    parser.add_argument("--ops", default="add_,mm,view")
    parser.add_argument("--profiler", default="on,off", help="on, off or both (on,off)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(LOOP)
        trees = {arg: tree(arg, Path(tmp)) for arg in args.trees}
        jobs = [(arg, op, p) for op in args.ops.split(",") for p in args.profiler.split(",")
                for arg in trees]  # fmt: skip
        with ThreadPoolExecutor(2) as pool:
            counts = list(pool.map(lambda j: instructions(trees[j[0]], script, j[1], j[2]), jobs))
    print("| op | profiler | " + " | ".join(args.trees) + " |")
    print("|---|---|" + "---:|" * len(args.trees))
    by = dict(zip(jobs, counts, strict=True))
    for op in args.ops.split(","):
        for p in args.profiler.split(","):
            cells = " | ".join(f"{by[(arg, op, p)]:,}" for arg in args.trees)
            print(f"| {op} | {p} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The memory of a real shapes-only torchrun under `neuron-explorer capture`, measured as the
machine sees it: every second, the PSS of each process of the job (smaps_rollup, shared pages
counted once per machine) and their sum; a watchdog ends the whole job (every process under it)
when the machine's MemAvailable falls under `--floor-gib`, so a job too large for a shared
machine never runs it out of memory (docs/device.md, "How many real ranks one machine holds").

    python benchmarks/torchrun_memory_bench.py RANKS LAYERS [--instruction-limit N] [-o DIR]

runs tests/ranks/shapes_llama_fsdp_worker.py (Llama-3-8B from its public config, LAYERS of its
32 decoder layers, FSDP2 over RANKS ranks, one step recorded of two) and prints the wall time,
the job's summed PSS peak, the largest process's PSS peak, the machine's lowest MemAvailable,
and the profile's step time and HBM peak when it completes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "ranks" / "shapes_llama_fsdp_worker.py"


def _kib(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                key, *value = line.split()
                if key in keys:
                    out[key] = int(value[0])
    except OSError:
        pass  # the process ended between the listing and the read
    return out


def descendants(root: int) -> list[int]:
    """`root` and every process under it (torchrun starts each rank in a session of its own,
    so the job is a tree, not one process group)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def job_pss_kib(root: int) -> dict[int, int]:
    """PSS (KiB) of each live process of the job under `root`."""
    pss = {
        pid: _kib(f"/proc/{pid}/smaps_rollup", ("Pss:",)).get("Pss:", 0)
        for pid in descendants(root)
    }
    return {pid: kib for pid, kib in pss.items() if kib}


def available_kib() -> int:
    return _kib("/proc/meminfo", ("MemAvailable:",))["MemAvailable:"]


def watch(
    command: list[str], env: dict[str, str], floor_kib: int, verbose: bool = False
) -> dict[str, float]:
    """Run `command`, sampling its memory each second until it ends."""
    started = time.monotonic()
    proc = subprocess.Popen(command, env=env)
    peak_sum = peak_one = 0
    low = available_kib()
    killed = False
    next_report = started
    while proc.poll() is None:
        pss = job_pss_kib(proc.pid)
        peak_sum = max(peak_sum, sum(pss.values()))
        peak_one = max([peak_one, *pss.values()])
        low = min(low, available_kib())
        if verbose and time.monotonic() >= next_report:
            next_report += 10
            print(f"  {time.monotonic() - started:4.0f} s: {len(pss)} processes, summed PSS "
                  f"{sum(pss.values()) / 2**20:.2f} GiB, largest {max(pss.values(), default=0) >> 10}"
                  f" MiB, MemAvailable {available_kib() >> 10} MiB", flush=True)  # fmt: skip
        if low < floor_kib and not killed:
            print(f"watchdog: MemAvailable {low >> 10} MiB, ending the job", flush=True)
            for pid in descendants(proc.pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            killed = True
        time.sleep(1.0)
    return {
        "rc": proc.returncode, "wall_s": time.monotonic() - started, "killed": killed,
        "sum_pss_gib": peak_sum / 2**20, "rank_pss_mib": peak_one / 1024,
        "min_available_gib": low / 2**20,
    }  # fmt: skip


def summary(out: Path) -> str:
    """The captured profile's ranks, step time and HBM peak."""
    from neuron_explorer.model import Profile

    profile = Profile.open(out)
    steps = [s.dur_ns for s in profile.manifest.steps if s.rank == 0]
    hbm = (
        profile.duckdb()
        .execute("SELECT max(value) FROM counters WHERE name = 'memory_allocated'")
        .fetchone()[0]
    )
    return (f"{len(profile.manifest.ranks)} ranks, rank 0's recorded step {steps[-1] / 1e6:.0f} ms"
            f" modeled, HBM peak {(hbm or 0) / 2**30:.1f} GiB a NeuronCore")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ranks", type=int)
    parser.add_argument("layers", type=int)
    parser.add_argument("--instruction-limit", default=None)
    parser.add_argument("--floor-gib", type=float, default=1.5)
    parser.add_argument("-v", "--verbose", action="store_true", help="the job's memory every 10 s")
    parser.add_argument("-o", "--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp()) / "llama"
    env = {**os.environ, "NEURON_EXPLORER_SHAPES_ONLY": "1", "OMP_NUM_THREADS": "1"}
    if args.instruction_limit is not None:
        env["NEURON_EXPLORER_INSTRUCTION_LIMIT"] = args.instruction_limit
    command = [sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out), "--wait", "1",
               "--warmup", "0", "--active", "1", "--", "torchrun",
               f"--nproc-per-node={args.ranks}", "--master-addr=127.0.0.1", "--master-port=29533",
               str(WORKER), str(args.layers)]  # fmt: skip
    result = watch(command, env, int(args.floor_gib * 2**20), args.verbose)
    print(f"{args.ranks} ranks x {args.layers} layers: rc {result['rc']}, "
          f"{result['wall_s']:.0f} s, summed PSS peak {result['sum_pss_gib']:.2f} GiB, "
          f"largest process {result['rank_pss_mib']:.0f} MiB PSS, "
          f"MemAvailable low {result['min_available_gib']:.1f} GiB"
          f"{', ended by the watchdog' if result['killed'] else ''}", flush=True)  # fmt: skip
    if result["rc"] == 0:
        print(summary(out))


if __name__ == "__main__":
    main()

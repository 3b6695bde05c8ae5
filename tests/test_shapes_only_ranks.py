"""How many real shapes-only ranks this machine holds (docs/device.md, "How many real ranks one
machine holds"): `neuron-explorer capture -o DIR -- torchrun --nproc-per-node 8` of a
Llama-3-8B step from its public config, FSDP2 over the 8 ranks, data-less."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "ranks" / "shapes_llama_fsdp_worker.py"
RANKS = 8  # the most that fits: each rank peaks at about 1.3 GiB, 16 would need over 20 GiB
NEEDED_MIB = 14 * 1024  # what the machine must have free to start it (the job's peak ~10 GiB)


def _available_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


@pytest.mark.sweep  # eight real ranks of a full-size model on two cores: about five minutes
@pytest.mark.timeout(1500)
def test_eight_shapes_only_ranks_of_llama3_8b_with_fsdp2_capture_in_the_machines_memory(tmp_path):
    """Every rank runs the 8-billion-parameter step and is in the one profile, sharded over
    8 (its all-gathers and reduce-scatters priced for 8, the step fits trn2's HBM), and no
    rank's peak RSS passes 1.6 GiB but the one that assembles the job's profile (2.6 GiB)."""
    from test_distributed import free_port

    from neuron_explorer.analysis import get_rule
    from neuron_explorer.model import Profile

    if _available_mib() < NEEDED_MIB:
        pytest.skip(f"needs {NEEDED_MIB} MiB of free memory, {_available_mib()} MiB free")
    out = tmp_path / "llama8"
    env = {**os.environ, "NEURON_EXPLORER_SHAPES_ONLY": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out),
                           "--wait", "1", "--warmup", "0", "--active", "1", "--", "torchrun",
                           f"--nproc-per-node={RANKS}", "--master-addr=127.0.0.1",
                           f"--master-port={free_port()}", str(WORKER)],
                          capture_output=True, text=True, env=env, timeout=1400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    peaks = sorted(int(m) for m in re.findall(r"rank \d+ peak rss (\d+) MiB", proc.stdout))
    assert len(peaks) == RANKS
    assert peaks[-2] < 1.6 * 1024 and peaks[-1] < 2.6 * 1024, peaks
    profile = Profile.open(out)
    assert profile.manifest.ranks == tuple(range(RANKS))
    rows = (
        profile.duckdb()
        .execute(
            "SELECT rank, count(*) FILTER (WHERE kind = 'kernel'),"
            " min(json_extract(args, '$.world_size')::INT) FILTER (WHERE kind = 'collective'),"
            " count(*) FILTER (WHERE kind = 'collective' AND layer = 'device')"
            " FROM events GROUP BY rank ORDER BY rank"
        )
        .fetchall()
    )
    assert len({r[1:] for r in rows}) == 1  # every rank ran the same step
    assert rows[0][1] > 1000 and rows[0][2] == RANKS and rows[0][3] > 0
    assert get_rule("hbm-capacity").evaluate(profile) == []

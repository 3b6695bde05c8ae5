"""How many real shapes-only ranks this machine holds (docs/device.md, "How many real ranks one
machine holds"): `neuron-explorer capture -o DIR -- torchrun --nproc-per-node N` of a
Llama-3-8B step from its public config, FSDP2 over the N ranks, data-less: 8 ranks of the
whole model, and 32 ranks of the whole model with kernel-level events only."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "ranks" / "shapes_llama_fsdp_worker.py"


def _available_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


@pytest.mark.sweep  # many real ranks on two cores: three to eight minutes a case
@pytest.mark.timeout(1500)
@pytest.mark.parametrize(
    "ranks,layers,instructions,rank_gib,assembler_gib,needed_gib",
    [
        (8, 32, None, 1.6, 2.6, 14),  # the full model, instruction events at their default limit
        (32, 32, "0", 0.95, 2.2, 19),  # the most ranks: kernel-level events only (16 GiB, 8 min)
    ],
)
def test_shapes_only_ranks_of_llama3_8b_with_fsdp2_capture_in_the_machines_memory(
    tmp_path, ranks, layers, instructions, rank_gib, assembler_gib, needed_gib
):
    """Every rank runs the Llama-3-8B step (its 32 layers) and is in the one
    profile, sharded over all ranks (its all-gathers and reduce-scatters priced for them, the
    step fits trn2's HBM), the median rank's peak RSS is under `rank_gib` and none passes
    `assembler_gib` (what assembling the job's profile adds)."""
    from test_distributed import free_port

    from neuron_explorer.analysis import get_rule
    from neuron_explorer.model import Profile

    if _available_mib() < needed_gib * 1024:  # the job's summed peak and a margin for others
        pytest.skip(f"needs {needed_gib} GiB of free memory, {_available_mib()} MiB free")
    out = tmp_path / "llama"
    env = {**os.environ, "NEURON_EXPLORER_SHAPES_ONLY": "1", "OMP_NUM_THREADS": "1"}
    if instructions is not None:
        env["NEURON_EXPLORER_INSTRUCTION_LIMIT"] = instructions
    proc = subprocess.run([sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out),
                           "--wait", "1", "--warmup", "0", "--active", "1", "--", "torchrun",
                           f"--nproc-per-node={ranks}", "--master-addr=127.0.0.1",
                           f"--master-port={free_port()}", str(WORKER), str(layers)],
                          capture_output=True, text=True, env=env, timeout=1400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    peaks = sorted(int(m) for m in re.findall(r"rank \d+ peak rss (\d+) MiB", proc.stdout))
    assert len(peaks) == ranks
    # the rank whose part completes the job writes the job's profile (model/rank_parts.py),
    # and it alone: every other rank is its own step's, so the second highest is under the
    # rank bound; no rank, the assembler included, passes the assembler's bound.
    assert peaks[-2] < rank_gib * 1024 and peaks[-1] < assembler_gib * 1024, peaks
    profile = Profile.open(out)
    assert profile.manifest.ranks == tuple(range(ranks))
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
    assert rows[0][1] > 100 * layers and rows[0][2] == ranks and rows[0][3] > 0
    assert get_rule("hbm-capacity").evaluate(profile) == []

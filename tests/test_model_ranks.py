"""`neuron-explorer capture --model-ranks N` (docs/device.md, "Many ranks on one machine") on
the parallelisms other than DDP and FSDP2 (those: tests/test_device_shapes_only.py): DTensor
tensor parallelism runs modeled, its collectives priced for the group of N; a pipeline
schedule, whose stages exchange Python objects no copy sends, stops with one clear error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each case captures a small job (seconds)

WORKER = Path(__file__).resolve().parent / "ranks" / "model_ranks_parallel_worker.py"


def capture(out: Path, mode: str, ranks: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEURON_EXPLORER_SHAPES_ONLY": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out),
                           "--model-ranks", str(ranks), "--", "python", str(WORKER), mode],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip


def test_tensor_parallel_shards_over_the_modeled_ranks_and_prices_its_collectives(tmp_path):
    from neuron_explorer.model import Profile

    proc = capture(tmp_path / "tp", "tp", 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tp local weight (256, 256)" in proc.stdout  # 1024 output rows over 4 ranks
    rows = (
        Profile.open(tmp_path / "tp")
        .duckdb()
        .execute(
            "SELECT json_extract(args, '$.world_size')::INT, dur_ns FROM events"
            " WHERE kind = 'collective'"
        )
        .fetchall()
    )
    # RowwiseParallel's all-reduce of the output, forward and backward's input grads
    assert rows and all(size == 4 and dur > 0 for size, dur in rows)
    extra = json.loads((tmp_path / "tp" / "manifest.json").read_text())["extra"]
    assert extra["model_ranks"] == {"world_size": 4, "executed": [0], "copies": [1, 2, 3]}


def test_a_pipeline_schedule_stops_with_one_error_naming_why(tmp_path):
    proc = capture(tmp_path / "pp", "pp", 2)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-2]  # before capture's "wrote profile" line
    assert last.startswith("neuron_explorer.errors.ExplorerError: --model-ranks 2:")
    assert "recv_object_list" in last and "torchrun" in last
    assert "EOFError" not in proc.stderr

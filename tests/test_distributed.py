"""The `neuron` torch.distributed backend under real torchrun processes on this machine's CPUs:
every collective and DDP training give exactly what gloo gives on the CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "ranks" / "collectives_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    script: Path, nproc: int, *args: str, timeout: int = 240
) -> subprocess.CompletedProcess:
    """Run `script` under torchrun on 127.0.0.1 (a free port), one CPU thread per rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(script), *args]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


def results(mode: str, nproc: int, tmp: Path) -> list[dict]:
    out = tmp / mode
    out.mkdir()
    torchrun(WORKER, nproc, mode, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """The same program on CPU tensors over gloo."""
    return results("gloo", 2, tmp_path_factory.mktemp("gloo"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["neuron", "mixed"])
def test_every_collective_and_ddp_equal_gloo_on_the_cpu(mode, reference, tmp_path):
    got = results(mode, 2, tmp_path)
    for rank, (mine, ref) in enumerate(zip(got, reference, strict=True)):
        assert set(mine["collectives"]) == set(ref["collectives"])
        for name, value in ref["collectives"].items():
            assert mine["collectives"][name] == value, (mode, rank, name)
        assert mine["ddp"] == ref["ddp"], (mode, rank)
    # the reference itself is not trivial: ranks differ where they must
    assert (
        reference[0]["collectives"]["reduce_scatter_tensor"]
        != reference[1]["collectives"]["reduce_scatter_tensor"]
    )
    assert reference[1]["collectives"]["send_recv"] == [7.0, 7.0]


@pytest.mark.sweep  # four torchrun ranks on two cores: about a minute
def test_four_ranks_equal_gloo(tmp_path):
    got, ref = results("neuron", 4, tmp_path), results("gloo", 4, tmp_path)
    assert got == ref

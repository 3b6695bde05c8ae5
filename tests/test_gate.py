"""`neuron-explorer diff BASE NEW --gate`: the regression verdict on real captures of a small
model on the neuron device: the same program twice passes, the program with three times the matmuls
per step fails with exit status 1, and too few steps is "inconclusive". The steps are
device-bound, so their modeled time, not the host's speed, decides the verdict."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from neuron_explorer.analysis.gate import mann_whitney_p, parse_gate
from neuron_explorer.errors import ExplorerError

pytestmark = pytest.mark.slow  # three small captures (seconds each)
# the verdicts on four small captures (~35 s quiet, ~80 s loaded) run in the sweeps (default
# suite < 15 min); the argument checks stay in the default run
CAPTURED = pytest.mark.sweep

SCRIPT = """
import sys, torch, neuron_explorer
matmuls, steps, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
x = torch.randn(1024, 1024).to("neuron")
with neuron_explorer.profile(out, wait=0, warmup=1, active=steps) as prof:
    for _ in range(steps + 1):
        y = x
        for _ in range(matmuls):
            y = (y @ x) * 0.001
        y.sum().item()  # the host waits for the device: the step is the device's work
        prof.step()
"""


def capture(matmuls: int, steps: int = 6) -> str:
    out = Path(tempfile.mkdtemp(prefix="gate-")) / "profile"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(matmuls), str(steps), str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return str(out)


def diff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_explorer", "diff", *args],
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def captures() -> dict[str, str]:
    # six steps a side, the slow program three times the matmuls: a host hiccup of a loaded
    # machine (kept on the modeled clock) in one or two steps cannot hide the regression
    return {"base": capture(8), "same": capture(8), "slow": capture(24), "short": capture(8, 2)}


@CAPTURED
def test_same_program_passes(captures):
    proc = diff(captures["base"], captures["same"], "--gate", "5%")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("gate: PASS")


@CAPTURED
def test_slowed_program_fails_with_exit_1(captures):
    proc = diff(captures["base"], captures["slow"], "--gate", "5%", "--json")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
    doc = json.loads(proc.stdout)
    g = doc["gate"]
    assert g["verdict"] == "regression" and g["change"] > 0.5 and g["p_value"] <= g["alpha"]
    assert len(g["base_steps"]) == len(g["new_steps"]) == 6
    # what moved most: the matmuls, named in the comparison the verdict comes with
    assert doc["ops"][0]["name"] in ("aten::mm", "aten::matmul") and doc["ops"][0]["delta"] > 0
    text = diff(captures["base"], captures["slow"], "--gate", "5%")
    assert text.returncode == 1 and text.stdout.startswith("gate: REGRESSION")
    # the op's own per-step device time is a metric too
    by_op = diff(captures["base"], captures["slow"], "--gate", "50%", "--metric", "op=aten::mm")
    assert by_op.returncode == 1, by_op.stdout[:500]


@CAPTURED
def test_too_few_steps_is_inconclusive(captures):
    proc = diff(captures["base"], captures["short"], "--gate", "5%", "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["gate"]["verdict"] == "inconclusive"


def test_gate_arguments():
    assert parse_gate("5%") == pytest.approx(0.05) and parse_gate("0.1") == pytest.approx(0.1)
    with pytest.raises(ExplorerError):
        parse_gate("five")
    # every NEW step above every BASE step: 1 split in C(6,3)=20 is as extreme
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(1 / 20)
    assert mann_whitney_p([4, 5, 6], [1, 2, 3]) == 1.0


@CAPTURED
def test_chip_swap_moves_a_device_bound_step(captures):
    """The same device-bound capture on another chip: each kernel lowered again with that
    chip's spec, so the step moves by what the cost model says of its matmuls."""
    from neuron_explorer.analysis.whatif import whatif
    from neuron_explorer.model.profile import Profile

    prof = Profile.open(captures["base"])
    assert whatif(prof, chip="trn2").saving_ns == 0  # the chip it was captured on
    other = whatif(prof, chip="trn1")
    assert other.saving_ns != 0 and other.events_changed >= 8 * 2  # matmuls and their scales

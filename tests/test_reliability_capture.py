"""Capture never harms the workload: an exception in the user's script, in backward on the
neuron device, or inside the profiler's own handler (an output path that cannot be written, a
temporary directory the script removed) leaves the script's own result (its exception, or
none); what ran is still written when it can be; the device keeps working afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from neuron_explorer.capture.runner import Schedule, run_captured
from neuron_explorer.model import Profile

ROOT = Path(__file__).resolve().parents[1]
TRAIN = """
import torch
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained", step + 1)
"""


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return path


def _capture(capfd, script: Path, out: Path):  # CaptureResult, stdout, stderr
    res = run_captured(["python", str(script)], out, Schedule(wait=1, warmup=1, active=2))
    captured = capfd.readouterr()
    return res, captured.out, captured.err


def test_the_scripts_exception_is_the_result_and_its_profile_is_written(tmp_path, capfd):
    script = _script(tmp_path, TRAIN + "raise KeyError('the user broke it')\n")
    res, out, err = _capture(capfd, script, tmp_path / "run")
    assert res.exit_code == 1 and "trained 6" in out
    assert "KeyError: 'the user broke it'" in err and "neuron-explorer/" not in err
    assert [s.step for s in Profile.open(tmp_path / "run").manifest.steps] == [2, 3]


def test_an_unwritable_output_leaves_the_run_alone(tmp_path, capfd):
    (tmp_path / "a_file").write_text("not a directory")
    out = tmp_path / "a_file" / "run"
    res, stdout, err = _capture(capfd, _script(tmp_path, TRAIN), out)
    assert res.exit_code == 0 and "trained 6" in stdout and res.profiles == ()
    assert f"neuron-explorer: profile {out} not written" in err and "Traceback" not in err


def test_the_profilers_temporary_directory_removed_by_the_script(tmp_path, capfd):
    """The script points tempfile at a scratch directory and deletes it mid-run: exporting the
    cycle's trace fails inside prof.step(), which runs in the script's optimizer.step()."""
    script = _script(
        tmp_path,
        "import shutil, tempfile\n"
        "scratch = tempfile.mkdtemp()\n"
        "tempfile.tempdir = scratch\n"
        "shutil.rmtree(scratch)\n" + TRAIN,
    )
    saved = tempfile.tempdir
    try:
        res, stdout, err = _capture(capfd, script, tmp_path / "run")
    finally:
        tempfile.tempdir = saved
    assert res.exit_code == 0 and "trained 6" in stdout, err[-3000:]
    assert "not written" in err and "Traceback" not in err, err[-3000:]


DEVICE_SCRIPT = """
import torch

class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise ValueError("backward failed on purpose")

model = torch.nn.Linear(8, 4).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    loss = model(torch.randn(16, 8, device="neuron")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
Boom.apply(model(torch.randn(2, 8, device="neuron"))).sum().backward()
"""
DRIVER = """
import sys, torch
from neuron_explorer import backend  # the neuron device
from neuron_explorer.capture.runner import run_captured
res = run_captured(["python", sys.argv[1]], sys.argv[2])
print("RESULT", res.exit_code, len(res.profiles), res.steps_seen)
m = torch.nn.Linear(8, 4).to("neuron")
loss = m(torch.randn(3, 8, device="neuron")).sum()
loss.backward()
print("DEVICE", m.weight.grad.device, torch.allclose(m.weight.grad.cpu(), torch.full((4, 8), 0.0) + m.weight.grad.cpu()))
"""


@pytest.mark.slow  # a capture with backward on the device: ~11 s
def test_an_exception_in_backward_on_the_device(tmp_path):
    """In a process of its own: with the Python device guard an error inside a backward kernel
    could abort the interpreter, which must not take the test run with it."""
    script = _script(tmp_path, DEVICE_SCRIPT)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(script), str(out)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ValueError: backward failed on purpose" in proc.stderr
    assert "RESULT 1 1 4" in proc.stdout  # the script's error, one profile, 4 optimizer steps
    assert "DEVICE neuron:0 True" in proc.stdout  # forward and backward still run on the device
    prof = Profile.open(out)
    kernels = prof.duckdb().execute("SELECT count(*) FROM events WHERE kind = 'kernel'").fetchone()
    assert kernels[0] > 0 and prof.manifest.steps


if __name__ == "__main__":
    pytest.main([__file__])

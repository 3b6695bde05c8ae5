"""Atomic writes: SIGKILL `neuron-explorer import` of a large trace and the capture writer at
random points, several times each. The output directory is either absent or a complete, correct
profile; the hidden temporaries a kill leaves are never listed and are cleared by the next
write, which succeeds."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_explorer.importers import import_traces
from neuron_explorer.model import Profile
from neuron_explorer.web.store import ProfileStore

ROOT = Path(__file__).resolve().parents[1]
NS_TRACE = (
    ROOT
    / "tests"
    / "data"
    / "kineto-gpu"
    / ("ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
)
SAMPLE_TRACE = ROOT / "samples" / "traces" / "cpu_mlp_train.pt.trace.json.gz"
IMPORT_KILLS = 5
WRITER_KILLS = 6
KILL_SEED = 20261130
PY = [sys.executable, "-m", "neuron_explorer"]
ENV = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONPATH": str(ROOT)}
SMALL_TRAIN = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(8):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
# the capture writer alone (merge + ProfileWriter) on a collected cycle, without torch's start-up
WRITER = """
import shutil, sys, tempfile
from pathlib import Path
from neuron_explorer.capture.handler import RawCapture, write_profile
work = Path(tempfile.mkdtemp(prefix="kill-writer-"))
shutil.copy(sys.argv[1], work / "trace.json")
write_profile(RawCapture(work, work / "trace.json", (), None, (), "test"), Path(sys.argv[2]))
shutil.rmtree(work)
"""


def big_trace(path: Path, copies: int = 2) -> Path:
    """The ns-resolution GPU trace with its events repeated `copies` times (about 140k events)."""
    doc = json.loads(gzip.decompress(NS_TRACE.read_bytes()))
    doc["traceEvents"] = doc["traceEvents"] * copies
    path.write_text(json.dumps(doc))
    return path


def temporaries(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.*"))


def kill_at_random(
    cmd: list[str], out: Path, rng: random.Random, span_s: float, during_write: bool | None = None
) -> str:
    """Start `cmd`; SIGKILL it at a random time, or (about every other call, or when
    `during_write`) a random moment after its temporary directory appears, while the profile is
    being written. Says when it died."""
    proc = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    t0 = time.monotonic()
    if during_write is None:
        during_write = rng.random() < 0.5
    if not during_write:
        time.sleep(rng.uniform(0.1, span_s))
        when = f"{time.monotonic() - t0:.2f} s after start"
    else:
        while not [p for p in temporaries(out) if ".tmp-" in p.name] and proc.poll() is None:
            if time.monotonic() - t0 > 120:
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0, max(0.1, span_s - (time.monotonic() - t0))))
        when = f"{time.monotonic() - t0:.2f} s after start, while writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return when if proc.returncode == -signal.SIGKILL else "after it had finished"


def assert_absent_or_complete(out: Path, counts: dict[str, int] | None) -> bool:
    """True when `out` is a profile (then complete: every table holds its manifest's rows)."""
    if not out.exists():
        return False
    prof = Profile.open(out)  # raises for anything incomplete
    for name, n in prof.manifest.row_counts.items():
        assert prof.dataset(name).count_rows() == n
    if counts is not None:
        assert prof.manifest.row_counts == counts
    return True


def test_killed_imports_leave_nothing_that_looks_like_a_profile(tmp_path):
    trace = big_trace(tmp_path / "big.json")
    t0 = time.monotonic()
    reference = Profile.open(import_traces([trace], tmp_path / "reference")).manifest.row_counts
    span = 1.0 + (time.monotonic() - t0)  # start-up plus the import
    out = tmp_path / "served" / "run"
    rng = random.Random(KILL_SEED)
    report = []
    for i in range(IMPORT_KILLS):
        if i % 2 == 0 and out.exists():  # every other run writes anew, the others replace
            shutil.rmtree(out)
        when = kill_at_random(
            [*PY, "import", str(trace), "-o", str(out), "--force", "-q"], out, rng, span
        )
        complete = assert_absent_or_complete(out, reference)
        report.append(f"{when}: {'a complete profile' if complete else 'no profile'}")
        # the hidden leftovers are not profiles a server lists
        assert ProfileStore(out.parent).names() == (["run"] if complete else [])
    print("\nimport kills:", "; ".join(report))
    done = subprocess.run([*PY, "import", str(trace), "-o", str(out), "--force", "-q"], env=ENV,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Profile.open(out).manifest.row_counts == reference
    assert temporaries(out) == [], "the next write clears what the killed ones left"


@pytest.mark.sweep  # ~12 s quiet; the killed imports stay in the default run
def test_killed_capture_writer_leaves_nothing_that_looks_like_a_profile(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_bytes(gzip.decompress(SAMPLE_TRACE.read_bytes()))
    out = tmp_path / "profiles" / "run"
    rng = random.Random(KILL_SEED + 1)
    report = []
    for i in range(WRITER_KILLS):
        if i % 2 == 0 and out.exists():
            shutil.rmtree(out)
        when = kill_at_random([sys.executable, "-c", WRITER, str(trace), str(out)], out, rng, 1.2)
        complete = assert_absent_or_complete(out, None)
        report.append(f"{when}: {'a complete profile' if complete else 'no profile'}")
        assert ProfileStore(out.parent).names() == (["run"] if complete else [])
    print("\ncapture-writer kills:", "; ".join(report))
    # the real command, killed once mid-write, then run to the end (a rerun replaces a profile)
    script = tmp_path / "train.py"
    script.write_text(SMALL_TRAIN)
    cap = [*PY, "capture", "-o", str(out), "--", "python", str(script)]
    shutil.rmtree(out, ignore_errors=True)
    when = kill_at_random(cap, out, rng, 0.5, during_write=True)
    assert_absent_or_complete(out, None)
    print("capture kill:", when)
    done = subprocess.run(cap, env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    prof = Profile.open(out)
    assert prof.manifest.source == "capture" and prof.row_count("events") > 0
    assert temporaries(out) == []

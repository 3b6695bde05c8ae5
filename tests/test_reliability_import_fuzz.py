"""Importer fuzzing: mutated real traces (truncated, bit-flipped, fields removed or of the wrong
type, huge numbers, negative durations, unicode names, deeply nested args) through the CLI's
import path. Each input imports (and then opens with the row counts of its manifest) or fails
with one line `neuron-explorer: error: FILE: problem` and status 2; no traceback, no hang, and
nothing left beside the output. Run with -s to see how many inputs were tried."""

from __future__ import annotations

import contextlib
import gzip
import io
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz.mutate import KINDS, load, mutate, seed_traces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_explorer.cli import main
from neuron_explorer.model import Profile

ROOT = Path(__file__).resolve().parents[1]
PER_INPUT_LIMIT_S = 30  # the largest seed imports in about 0.1 s; a hang trips this alarm
FUZZ_EXAMPLES = 300
SEEDS = [(p.name, load(p)) for p in seed_traces()]


class Hang(Exception):
    pass


def _alarm(*_: object) -> None:
    raise Hang(f"an import ran past {PER_INPUT_LIMIT_S} s")


def write_input(dir_: Path, stem: str, data: bytes) -> Path:
    """The input file, named .json.gz when the bytes are gzip'd (as a user's file would be)."""
    path = dir_ / (f"{stem}.json.gz" if data[:2] == b"\x1f\x8b" else f"{stem}.json")
    path.write_bytes(data)
    return path


def import_in_process(trace: Path, out: Path) -> tuple[int, str]:
    """`neuron-explorer import TRACE -o OUT -q` in this process: (status, stderr)."""
    err = io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(PER_INPUT_LIMIT_S)
    try:
        with contextlib.redirect_stderr(err):
            rc = main(["import", str(trace), "-o", str(out), "-q"])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, err.getvalue()


def check_outcome(trace: Path, out: Path, rc: int, stderr: str) -> bool:
    """Asserts the contract; True when the input imported."""
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert not leftovers, f"{trace}: temporary directories left behind: {leftovers}"
    if rc == 0:
        prof = Profile.open(out)
        for name, count in prof.manifest.row_counts.items():
            assert prof.dataset(name).count_rows() == count, (trace, name)
        return True
    assert rc == 2, (trace, rc, stderr[-2000:])
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, (trace, stderr[-2000:])
    assert lines[0].startswith(f"neuron-explorer: error: {trace}: "), lines[0]
    assert not out.exists(), f"{trace}: failed import left {out}"
    return False


def test_mutated_real_traces_import_or_fail_in_one_line(tmp_path):
    assert SEEDS, "no seed traces found"
    tried = {"imported": 0, "refused": 0}
    kinds: dict[str, int] = {}
    inputs, outputs = tmp_path / "in", tmp_path / "out"
    inputs.mkdir(), outputs.mkdir()

    @settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(seed=st.sampled_from(range(len(SEEDS))), kind=st.sampled_from(KINDS),
           salt=st.integers(0, 2**32 - 1))  # fmt: skip
    def one(seed: int, kind: str, salt: int) -> None:
        n = sum(tried.values())
        name, raw = SEEDS[seed]
        trace = write_input(inputs, f"{n}-{kind}", mutate(raw, kind, random.Random(salt)))
        out = outputs / f"p{n}"
        rc, stderr = import_in_process(trace, out)
        ok = check_outcome(trace, out, rc, stderr)
        tried["imported" if ok else "refused"] += 1
        kinds[kind] = kinds.get(kind, 0) + 1
        trace.unlink()
        if out.exists():
            import shutil

            shutil.rmtree(out)

    one()
    total = sum(tried.values())
    print(f"\nimporter fuzz: {total} mutated traces tried from {len(SEEDS)} real ones: "
          f"{tried['imported']} imported, {tried['refused']} refused in one line; by mutation {kinds}")  # fmt: skip
    assert total >= FUZZ_EXAMPLES * 0.9 and tried["imported"] and tried["refused"]
    assert set(kinds) == set(KINDS)


DEEP = b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1, "args": '
HAND_PICKED = {
    "empty": b"",
    "whitespace": b"  \n\t ",
    "null": b"null",
    "list": b"[]",
    "object": b"{}",
    "no_events": b'{"traceEvents": []}',
    "nan": b'{"traceEvents": [{"ph": "X", "name": "a", "ts": NaN, "dur": 1, "pid": 1, "tid": 1}]}',
    "binary": bytes(range(256)) * 4,
    "gzip_empty": gzip.compress(b""),
    "gzip_garbage": b"\x1f\x8b" + bytes(range(200)),
    "deep_100k": DEEP + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
    "deep_unclosed": DEEP + b"{" * 200_000,
    "bom": b"\xef\xbb\xbf" + b'{"traceEvents": []}',
    "huge_ts": b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1e400, "dur": -5, "pid": 1, "tid": 1}]}',
    "neg_dur": b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 5, "dur": -5, "pid": 1, "tid": 1}]}',
}  # fmt: skip


@pytest.mark.parametrize("case", HAND_PICKED)
def test_hand_picked_bad_inputs(tmp_path, case):
    trace = write_input(tmp_path, case, HAND_PICKED[case])
    rc, stderr = import_in_process(trace, tmp_path / "out")
    check_outcome(trace, tmp_path / "out", rc, stderr)


@pytest.mark.parametrize("kind", ["deep_args", "gzip_truncated", "wrong_type"])
def test_mutated_traces_through_the_real_command(tmp_path, kind):
    """The console command in its own process: what a user sees, including the status."""
    name, raw = SEEDS[0]
    data = mutate(raw, kind, random.Random(7))
    if kind == "deep_args":  # the deepest nesting, so msgspec's recursion limit is reached
        data = DEEP + b"[" * 100_000 + b"]" * 100_000 + b"}]}"
    trace = write_input(tmp_path, kind, data)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "neuron_explorer", "import", str(trace), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert "Traceback" not in proc.stderr
    check_outcome(trace, out, proc.returncode, proc.stderr if proc.returncode else "")


def test_the_atheris_target_checks_its_inputs():
    """tests/fuzz/fuzz_import.py's check runs without atheris too: raw bytes and mutations."""
    from fuzz import fuzz_import

    outcomes = [fuzz_import.check_one(fuzz_import.input_for(data)) for data in
                (b"", b"\x00{}", bytes([200, 0, 1, 2, 3, 4]), bytes([65, 3, 9, 9, 9, 9]))]  # fmt: skip
    assert outcomes[:2] == [False, False] and True in outcomes


def test_the_atheris_target_runs_on_demand(tmp_path):
    pytest.importorskip("atheris")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz" / "fuzz_import.py"),
                           "-runs=200", "-seed=1"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and "Done 200 runs" in proc.stderr, proc.stderr[-3000:]

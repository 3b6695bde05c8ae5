"""atheris (libFuzzer) target for the importer, run on demand:

    pip install atheris
    .venv/bin/python tests/fuzz/fuzz_import.py -runs=2000 [-max_len=200000] [CORPUS_DIR]

Each input is either taken as the trace file's bytes, or picks a real seed trace and one of
tests/fuzz/mutate.py's mutations (the first byte decides). The contract is the one the
hypothesis test checks: the import succeeds and its profile opens with its manifest's row counts,
or `neuron-explorer import` fails with one line naming the file and status 2. Anything else
(a traceback, another status, a leftover temporary) raises, which libFuzzer reports with the
input. Without atheris the script says so and exits 0.
"""

from __future__ import annotations

import contextlib
import io
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fuzz.mutate import KINDS, load, mutate, seed_traces

SEEDS = [load(p) for p in seed_traces()]
_WORK: list[Path] = []  # one scratch directory per process, made on first use


def _work() -> Path:
    if not _WORK:
        _WORK.append(Path(tempfile.mkdtemp(prefix="fuzz-import-")))
    return _WORK[0]


def check_one(data: bytes) -> bool:
    """Import `data` as a trace through the CLI in this process; True if it imported. Raises
    AssertionError when the contract is broken."""
    from neuron_explorer.cli import main
    from neuron_explorer.model import Profile

    work = _work()
    trace = work / ("input.json.gz" if data[:2] == b"\x1f\x8b" else "input.json")
    out = work / "out"
    trace.write_bytes(data)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["import", str(trace), "-o", str(out), "-q"])
        left = [p.name for p in work.iterdir() if p.name.startswith(".out.")]
        assert not left, f"temporaries left: {left}"
        if rc == 0:
            prof = Profile.open(out)
            for name, n in prof.manifest.row_counts.items():
                assert prof.dataset(name).count_rows() == n, name
            return True
        lines = err.getvalue().strip().splitlines()
        assert rc == 2 and len(lines) == 1, (rc, err.getvalue()[-2000:])
        assert lines[0].startswith(f"neuron-explorer: error: {trace}: "), lines[0]
        assert not out.exists()
        return False
    finally:
        shutil.rmtree(out, ignore_errors=True)
        trace.unlink(missing_ok=True)


def input_for(data: bytes) -> bytes:
    """The trace bytes an atheris input stands for (raw, or a seeded mutation of a real trace)."""
    if len(data) < 6 or data[0] < 64:
        return data[1:]
    rng = random.Random(int.from_bytes(data[2:6], "little"))
    return mutate(SEEDS[data[1] % len(SEEDS)], KINDS[data[0] % len(KINDS)], rng)


def test_one_input(data: bytes) -> None:
    check_one(input_for(data))


def main() -> None:
    try:
        import atheris
    except ImportError:
        print("atheris is not installed (pip install atheris); nothing to fuzz", file=sys.stderr)
        return
    with atheris.instrument_imports(include=["neuron_explorer"]):  # coverage guides the mutations
        import neuron_explorer.cli
        import neuron_explorer.importers.kineto
        import neuron_explorer.importers.run  # noqa: F401
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

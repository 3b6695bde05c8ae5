"""`neuron-explorer import` through the real CLI: success, --force, and every kind of bad input
(one line naming the file and the problem, exit status 2, no partial profile left behind)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLE_TRACE

from neuron_explorer.cli import main
from neuron_explorer.model.profile import Profile

EXE = Path(sys.executable).parent / "neuron-explorer"
X = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.5, "dur": 2.0}


def write_json(path: Path, doc: object) -> Path:
    path.write_text("" if doc is None else json.dumps(doc))
    return path


def bad_inputs(tmp: Path) -> dict[str, tuple[list[Path], str]]:
    """name -> (inputs, words the error must contain)."""
    gz = gzip.compress(json.dumps({"traceEvents": [X] * 500}).encode())
    truncated = tmp / "truncated.json.gz"
    truncated.write_bytes(gz[: len(gz) // 2])
    garbage_gz = tmp / "garbage.json.gz"
    garbage_gz.write_bytes(b"\x1f\x8b" + b"not really gzip" * 10)
    invalid = tmp / "invalid.json"
    invalid.write_text('{"traceEvents": [{"ph": "X", ')
    empty_dir = tmp / "no_traces"
    empty_dir.mkdir()
    (empty_dir / "notes.txt").write_text("not a trace")
    no_ts = dict(X)
    del no_ts["ts"]
    no_dur = dict(X)
    del no_dur["dur"]
    return {
        "truncated gzip": ([truncated], "truncated gzip"),
        "corrupt gzip": ([garbage_gz], "gzip"),
        "invalid json": ([invalid], "invalid JSON"),
        "empty file": ([write_json(tmp / "blank.json", "")], "not a torch.profiler trace"),
        "zero bytes": ([write_json(tmp / "zero.json", None)], "empty file"),
        "not a trace": (
            [write_json(tmp / "other.json", {"hello": 1})],
            "not a torch.profiler trace",
        ),
        "a list": ([write_json(tmp / "list.json", [1, 2])], "not a torch.profiler trace"),
        "empty trace": ([write_json(tmp / "empty.json", {"traceEvents": []})], "empty trace"),
        "metadata only": (
            [write_json(tmp / "meta.json", {"traceEvents": [{"ph": "M", "name": "x"}]})],
            "empty trace",
        ),
        "missing ts": ([write_json(tmp / "nots.json", {"traceEvents": [X, no_ts]})], "'ts'"),
        "missing dur": ([write_json(tmp / "nodur.json", {"traceEvents": [no_dur]})], "'dur'"),
        "ts not a number": (
            [write_json(tmp / "strts.json", {"traceEvents": [{**X, "ts": "soon"}]})],
            "traceEvents[0].ts",
        ),
        "directory without traces": ([empty_dir], "no .json or .json.gz"),
        "no such file": ([tmp / "missing.json"], "no such file"),
    }


def _case_names() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return sorted(bad_inputs(Path(d)))


@pytest.mark.parametrize("case", _case_names())
def test_bad_input_is_one_line_exit_2_and_no_profile(tmp_path, capsys, case):
    inputs, words = bad_inputs(tmp_path)[case]
    out = tmp_path / "out" / "profile"
    rc = main(["import", *map(str, inputs), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("neuron-explorer: error: ")
    assert str(inputs[0]) in lines[0] and words in lines[0]
    assert "Traceback" not in err
    assert not out.exists()
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_existing_output_is_refused_then_replaced_with_force(tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["import", str(SAMPLE_TRACE), "-o", str(out), "-q"]) == 0
    first = Profile.open(out).manifest.origin_unix_ns
    assert main(["import", str(SAMPLE_TRACE), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "exists" in err[0]
    assert main(["import", str(SAMPLE_TRACE), "-o", str(out), "--force", "-q"]) == 0
    assert Profile.open(out).manifest.origin_unix_ns == first
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p"]  # no temporary leftovers


def test_duplicate_ranks_are_refused(tmp_path, capsys):
    a = write_json(tmp_path / "a.json", {"distributedInfo": {"rank": 3}, "traceEvents": [X]})
    b = write_json(tmp_path / "b.json", {"distributedInfo": {"rank": 3}, "traceEvents": [X]})
    assert main(["import", str(a), str(b), "-o", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "rank 3" in err and str(b) in err
    assert not (tmp_path / "p").exists()


def test_console_script_imports_the_sample(tmp_path):
    out = tmp_path / "demo"
    run = subprocess.run(
        [str(EXE), "import", str(SAMPLE_TRACE), "-o", str(out), "--source-root", "samples"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "imported 1 trace file(s)" in run.stderr
    p = Profile.open(out)
    assert p.manifest.source == "kineto" and p.row_count("events") > 1000
    assert len(p.manifest.steps) == 3
    # the sample's own script, in the root named (samples/, above the trace's folder), is kept
    assert p.source_text("record_trace.py") == (ROOT / "samples" / "record_trace.py").read_text()
    bad = subprocess.run(
        [str(EXE), "import", str(tmp_path / "nope.json"), "-o", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"neuron-explorer: error: {tmp_path / 'nope.json'}: no such file or directory"
    ]


# runs the CLI's import in a fresh interpreter; says what was loaded when the import itself
# returned (before the command's analysis) and at the end, and Arrow's allocator
_LOADED_PROBE = """
import json, sys
import neuron_explorer.importers as importers
from neuron_explorer.entry import main
at_import = []
def observed(*args, **kw):
    out = run_import(*args, **kw)
    at_import.extend(sys.modules)
    return out
run_import, importers.import_traces = importers.import_traces, observed
code = main(sys.argv[1:])
import pyarrow as pa
print(json.dumps({"code": code, "at_import": sorted(at_import), "at_end": sorted(sys.modules),
                  "pool": pa.default_memory_pool().backend_name}))
"""
NEVER = ("torch", "duckdb", "pandas", "fastapi", "uvicorn", "rich")  # by `import` at all
NOT_FOR_IMPORT = (*NEVER, "pyarrow.dataset", "neuron_explorer.capture.handler",
                  "neuron_explorer.analysis")  # fmt: skip


def test_import_loads_only_what_it_uses_and_arrow_on_the_system_allocator(tmp_path):
    # the import's peak memory counts every library loaded (the 100 MB benchmark trace: 145 MB
    # of which 77 MB is the interpreter and its libraries), and mimalloc kept freed buffers
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    run = subprocess.run(
        [sys.executable, "-c", _LOADED_PROBE, "import", str(SAMPLE_TRACE), "-o",
         str(tmp_path / "p"), "-q"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["code"] == 0 and Profile.open(tmp_path / "p").row_count("events") > 1000
    assert "neuron_explorer.importers.kineto" in got["at_import"]
    loaded = [m for m in got["at_import"] if m.startswith(NOT_FOR_IMPORT)]
    assert loaded == [], f"the import loaded {loaded}"
    loaded = [m for m in got["at_end"] if m.startswith(NEVER)]
    assert loaded == [], f"the import command loaded {loaded}"
    assert got["pool"] == "system"


def test_help_describes_the_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["import", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--force" in out and "PROFILE_DIR" in out and "TRACE" in out


def test_ranks_come_from_distributed_info_then_file_order(tmp_path):
    from neuron_explorer.importers import import_traces

    a = write_json(tmp_path / "a.json", {"traceEvents": [X]})
    b = write_json(tmp_path / "b.json", {"distributedInfo": {"rank": 0}, "traceEvents": [X]})
    c = write_json(tmp_path / "c.json", {"traceEvents": [X]})
    p = Profile.open(import_traces([a, b, c], tmp_path / "p"))
    assert p.manifest.ranks == (0, 1, 2)
    by_input = {e["rank"]: e["path"] for e in p.manifest.extra["kineto"]}
    assert by_input == {1: str(a), 0: str(b), 2: str(c)}


def test_gzip_of_several_members_is_read_whole(tmp_path):
    text = gzip.decompress(SAMPLE_TRACE.read_bytes())
    half = len(text) // 2
    two = tmp_path / "two_members.json.gz"
    two.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))
    assert main(["import", str(two), "-o", str(tmp_path / "a"), "-q"]) == 0
    assert main(["import", str(SAMPLE_TRACE), "-o", str(tmp_path / "b"), "-q"]) == 0
    assert Profile.open(tmp_path / "a").manifest.row_counts == (
        Profile.open(tmp_path / "b").manifest.row_counts
    )


def test_traces_of_different_runs_are_refused_unless_told(tmp_path, capsys):
    """Two real traces of different runs: another world size (nccl: 2 ranks, ns_resolution: 1),
    or time spans months apart (alexnet and ns_resolution) are one line and exit 2; with
    --mixed-runs they merge (compare_base is rank 1, alexnet rank 0)."""
    from conftest import KINETO_GPU, SHARED_KINETO

    nccl, ns, alexnet, base = (
        KINETO_GPU / SHARED_KINETO[k] for k in ("nccl", "ns_resolution", "alexnet", "compare_base")
    )
    assert main(["import", str(nccl), str(ns), "-o", str(tmp_path / "a"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "world size 1" in err and "--mixed-runs" in err
    assert main(["import", str(alexnet), str(base), "-o", str(tmp_path / "b"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "s after" in err and "different runs" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    mixed = ["import", str(alexnet), str(base), "-o", str(tmp_path / "c"), "-q", "--mixed-runs"]
    assert main(mixed) == 0
    assert Profile.open(tmp_path / "c").manifest.ranks == (0, 1)


def test_ranks_of_one_run_with_the_same_time_span_import(tmp_path):
    """Copies of one real trace as ranks 0 and 1 of a run: their spans are the same, one run."""
    import gzip
    import json

    from conftest import KINETO_GPU, SHARED_KINETO

    doc = json.loads(gzip.open(KINETO_GPU / SHARED_KINETO["compare_base"]).read())
    paths = []
    for rank in (0, 1):
        doc["distributedInfo"] = {"rank": rank, "world_size": 2}
        paths.append(write_json(tmp_path / f"rank{rank}.json", doc))
    assert main(["import", *map(str, paths), "-o", str(tmp_path / "p"), "-q"]) == 0
    assert Profile.open(tmp_path / "p").manifest.ranks == (0, 1)

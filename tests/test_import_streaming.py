"""The streaming import (a memory budget: the file read forward once in small ranges, the args
spilled to disk) writes the same profile as the in-memory import, on every trace in tests/data,
gzip or plain, object or array form; its progress; and a bad trace read as a stream is one line
naming the file, with no profile left behind."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import DATA

from neuron_explorer.cli import main
from neuron_explorer.cli.import_progress import ImportProgress, parse_size
from neuron_explorer.importers import import_traces
from neuron_explorer.importers.kineto_columns import range_bytes_for
from neuron_explorer.importers.kineto_ranges import decode_span
from neuron_explorer.importers.kineto_stream import MIN_READ, StreamSource, open_stream
from neuron_explorer.model.profile import Profile

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted(DATA.rglob("*.json.gz"))
BIG = 100_000  # compressed bytes: the traces above it take 10-30 s each, so they run in the sweeps
SMALL_BUDGET = 1 << 20  # 4 KB ranges: every trace here is cut into many
TABLES = ("events", "stacks", "counters")
_ALEXNET = (
    DATA / "kineto-gpu" / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
)


def _sorted(table: pa.Table) -> pa.Table:
    """Rows in one order whatever order they were written in (dictionaries decoded)."""
    columns = [
        c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in table.columns
    ]
    table = pa.table(columns, names=table.column_names)
    keys = [f.name for f in table.schema if not pa.types.is_nested(f.type)]
    return table.sort_by([(k, "ascending") for k in keys])


def _same_profile(streamed: Path, in_memory: Path) -> None:
    a, b = Profile.open(streamed), Profile.open(in_memory)
    for name in TABLES:
        got, want = _sorted(a.table(name)), _sorted(b.table(name))
        assert a.table(name).schema == b.table(name).schema, name
        assert got.num_rows == want.num_rows, name
        for column in want.column_names:  # row for row, a column at a time for a readable diff
            assert got[column].to_pylist() == want[column].to_pylist(), (name, column)
    assert a.manifest.row_counts == b.manifest.row_counts
    assert a.manifest.steps == b.manifest.steps
    assert a.manifest.ranks == b.manifest.ranks
    assert a.manifest.origin_unix_ns == b.manifest.origin_unix_ns


def test_every_trace_here_is_found():
    assert len(TRACES) >= 10


@pytest.mark.parametrize(
    "trace",
    [pytest.param(t, marks=pytest.mark.sweep) if t.stat().st_size > BIG else t for t in TRACES],
    ids=lambda p: p.name[:40],
)
def test_streaming_import_equals_the_in_memory_one(trace, tmp_path):
    seen: list[int] = []

    def progress(stage, fraction, events=None, bytes_read=None):
        if stage.startswith("reading") and events:
            seen.append(events)

    streamed = import_traces([trace], tmp_path / "s", memory_budget=SMALL_BUDGET, progress=progress)
    _same_profile(streamed, import_traces([trace], tmp_path / "m"))
    text = len(gzip.decompress(trace.read_bytes()))
    if text > 4 * range_bytes_for(SMALL_BUDGET):  # decoded in several ranges, counted as it went
        assert len(set(seen)) > 2, seen


def _plain_forms(tmp_path: Path, trace: Path) -> list[Path]:
    """The trace as plain JSON, and as a top-level array without its closing bracket."""
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    events = doc if isinstance(doc, list) else doc["traceEvents"]
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(doc, indent=1))
    array = tmp_path / "array.json"
    array.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n")
    return [plain, array]


def test_plain_and_array_forms_stream_the_same(tmp_path):
    trace = DATA / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz"
    for i, path in enumerate(_plain_forms(tmp_path, trace)):
        streamed = import_traces([path], tmp_path / f"s{i}", memory_budget=SMALL_BUDGET)
        _same_profile(streamed, import_traces([path], tmp_path / f"m{i}"))


def test_multi_member_gzip_streams_whole(tmp_path):
    trace = DATA / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz"
    text = gzip.decompress(trace.read_bytes())
    two = tmp_path / "two.json.gz"
    two.write_bytes(gzip.compress(text[: len(text) // 2]) + gzip.compress(text[len(text) // 2 :]))
    streamed = import_traces([two], tmp_path / "s", memory_budget=SMALL_BUDGET)
    _same_profile(streamed, import_traces([trace], tmp_path / "m"))


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_the_stream_holds_a_window_not_the_file(tmp_path, gz):
    doc = json.loads(gzip.decompress(_ALEXNET.read_bytes()))
    doc["traceEvents"] = doc["traceEvents"] * 40  # about 10 MB of text
    text = json.dumps(doc).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    f, is_gz = open_stream(path)
    with f:
        source = StreamSource(f, path, gzip=is_gz)
        span = decode_span(source, None, None, range_bytes=64 << 10, path=path)
    assert sum(len(p.ts.ns) for p in span.pieces) == len(doc["traceEvents"])
    assert len(span.pieces) > 20
    assert source.largest_window <= 2 * MIN_READ + (64 << 10) < len(text) // 2


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neuron_explorer", "import", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_progress_is_one_line_when_piped(tmp_path):
    trace = DATA / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz"
    run = _cli(str(trace), "-o", str(tmp_path / "p"), "--memory-budget", "1M")
    assert run.returncode == 0, run.stderr
    assert "\r" not in run.stderr
    read = [line for line in run.stderr.splitlines() if line.startswith("read ")]
    events = Profile.open(tmp_path / "p").manifest.row_counts
    assert len(read) == 1, run.stderr
    assert f"{trace.stat().st_size / 1000:.1f} KB" in read[0]
    assert " events in " in read[0] and read[0].endswith("/s)")
    assert int(read[0].split(", ")[1].split()[0].replace(",", "")) >= events["events"]


def test_progress_on_a_terminal_redraws_one_line():
    class Tty:
        def __init__(self) -> None:
            self.text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return True

    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0])
    out = Tty()
    p = ImportProgress(out, 4_000_000, clock=lambda: next(clock))  # type: ignore[arg-type]
    p("reading t.json", 0.25, 1000, 1_000_000)
    p("reading t.json", 0.5, 2000, 2_000_000)
    p.close()
    lines = out.text.split("\r")
    assert lines[1].rstrip() == "reading t.json  1.0 MB / 4.0 MB  1,000 events  1.0 MB/s  3s left"
    assert lines[2].rstrip() == "reading t.json  2.0 MB / 4.0 MB  2,000 events  1.0 MB/s  2s left"
    assert out.text.endswith("\r") and lines[-2].strip() == ""  # cleared at the end


def test_sizes_parse():
    assert parse_size("2G") == 2 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("1000") == 1000
    for bad in ("", "2X", "-1G", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


def _big_plain(tmp_path: Path) -> tuple[Path, bytes]:
    """A plain trace of a few hundred KB (many ranges under the small budget)."""
    trace = (
        DATA
        / "kineto-gpu"
        / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
    )
    text = gzip.decompress(trace.read_bytes())
    path = tmp_path / "t.json"
    path.write_bytes(text)
    return path, text


@pytest.mark.parametrize("damage", ["truncated", "garbled", "truncated-gzip"])
def test_a_bad_trace_is_one_line_and_no_profile(tmp_path, capsys, damage):
    path, text = _big_plain(tmp_path)
    assert len(text) > 64 * range_bytes_for(SMALL_BUDGET)
    if damage == "truncated":
        path.write_bytes(text[: len(text) * 2 // 3])
    elif damage == "garbled":
        at = len(text) // 2
        path.write_bytes(text[:at] + b'}}]"{,:' * 3 + text[at:])
    else:
        path.unlink()
        path = tmp_path / "t.json.gz"
        whole = gzip.compress(text)
        path.write_bytes(whole[: len(whole) // 2])
    out = tmp_path / "p"
    code = main(["import", str(path), "-o", str(out), "--memory-budget", "1M"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"neuron-explorer: error: {path}: "), err
    assert "Traceback" not in err[0]
    assert sorted(x.name for x in tmp_path.iterdir()) == [path.name]  # nothing half-written
    if damage == "garbled":  # the place named is the file's, as the in-memory import names it
        assert main(["import", str(path), "-o", str(out), "--memory-budget", "none"]) == 2
        whole = capsys.readouterr().err
        place = whole[whole.index("(byte ") :].split(")")[0]
        assert place in err[0], (err[0], whole)

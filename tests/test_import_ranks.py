"""Many trace files (a job's ranks) imported with a memory budget, each file written to a run
on disk at once and the runs written in rank order at the end (importers/rank_runs.py): the
same profile as the in-memory import of the same files, in any order given, with a member too
big for the budget imported in chunks; a mixed job refused in one line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import DATA
from test_import_streaming import BIG, TRACES, _same_profile

from neuron_explorer.cli import main
from neuron_explorer.importers import import_traces
from neuron_explorer.model.profile import Profile

BUDGET = 1 << 20  # small ranges: each file is streamed in many
GPT2 = DATA / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz"
KINETO_GPU = DATA / "kineto-gpu"
ALEXNET = KINETO_GPU / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
BASE = KINETO_GPU / "trace_compare_base_base.json.gz"
# gpt2's mapping (0.6 of its text, counted as 10x its gzip) is over this and alexnet's under
CHUNK_BUDGET = 200_000


def _as_ranks(trace: Path, ranks: list[int], folder: Path, world: int | None = None) -> list[Path]:
    """Copies of a real trace as the given ranks of one job (same time span, one run)."""
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in ranks:
        doc["distributedInfo"] = {"rank": rank, "world_size": world or len(ranks)}
        path = folder / f"rank{rank}.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
        paths.append(path)
    return paths


def _same_manifest(a: Path, b: Path) -> None:
    ma, mb = Profile.open(a).manifest, Profile.open(b).manifest
    assert (ma.devices, ma.inputs, ma.host, ma.extra) == (mb.devices, mb.inputs, mb.host, mb.extra)
    assert sorted(p.name for p in (a / "sources").rglob("*")) == sorted(
        p.name for p in (b / "sources").rglob("*")
    )


def _both(paths: list[Path], tmp_path: Path, **kw) -> tuple[Path, Path]:
    runs = import_traces(paths, tmp_path / "runs", memory_budget=BUDGET, **kw)
    memory = import_traces(paths, tmp_path / "memory", **kw)
    _same_profile(runs, memory)
    _same_manifest(runs, memory)
    return runs, memory


@pytest.mark.parametrize(
    "trace",
    [pytest.param(t, marks=pytest.mark.sweep) if t.stat().st_size > BIG else t for t in TRACES],
    ids=lambda p: p.name[:40],
)
def test_ranks_of_every_trace_here_import_as_in_memory(trace, tmp_path):
    _both(_as_ranks(trace, [0, 1], tmp_path / "t"), tmp_path)


def test_eight_ranks_given_in_reverse_order(tmp_path):
    paths = _as_ranks(GPT2, list(range(8)), tmp_path / "t")[::-1]
    runs, _ = _both(paths, tmp_path)
    manifest = Profile.open(runs).manifest
    assert manifest.ranks == tuple(range(8))
    assert [e["rank"] for e in manifest.extra["kineto"]] == list(range(7, -1, -1))
    assert pq.ParquetFile(runs / "stacks.parquet").num_row_groups == 8  # a rank at a time
    events = Profile.open(runs).table("events")
    assert (
        events.num_rows
        == 8 * Profile.open(import_traces([GPT2], tmp_path / "one")).table("events").num_rows
    )


def test_real_traces_of_two_runs_merge_when_told(tmp_path):
    """alexnet is rank 0, compare_base rank 1, months apart: merged only with mixed_runs."""
    _both([BASE, ALEXNET], tmp_path, mixed_runs=True)


def test_a_member_too_big_for_the_budget_is_imported_in_chunks(tmp_path):
    """gpt2 (no rank: it takes the lowest free one, 2) in chunks beside two files mapped whole."""
    paths = [GPT2, ALEXNET, BASE]
    runs = import_traces(
        paths, tmp_path / "runs", memory_budget=BUDGET, chunk_budget=CHUNK_BUDGET, mixed_runs=True
    )
    memory = import_traces(paths, tmp_path / "memory", mixed_runs=True)
    _same_profile(runs, memory)
    _same_manifest(runs, memory)
    assert Profile.open(runs).manifest.ranks == (0, 1, 2)


def test_ranks_of_another_world_size_are_refused_in_one_line(tmp_path, capsys):
    paths = _as_ranks(GPT2, [0, 1], tmp_path / "a") + _as_ranks(GPT2, [2], tmp_path / "b", 4)
    args = ["import", *map(str, paths), "-o", str(tmp_path / "p"), "-q", "--memory-budget", "1M"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "world size 4" in err and "--mixed-runs" in err
    assert str(paths[-1]) in err
    assert not (tmp_path / "p").exists()


def test_progress_goes_forward_over_every_file(tmp_path):
    seen: list[tuple[float, int | None, int | None]] = []

    def progress(stage, fraction, events=None, bytes_read=None):
        seen.append((fraction, events, bytes_read))

    paths = _as_ranks(GPT2, [0, 1, 2], tmp_path / "t")
    import_traces(paths, tmp_path / "p", memory_budget=BUDGET, progress=progress)
    fractions = [f for f, _, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    events = [e for _, e, _ in seen if e is not None]
    assert events == sorted(events) and events[-1] >= 3 * 2949 // 2
    read = [b for _, _, b in seen if b is not None]
    assert read == sorted(read) and read[-1] == sum(p.stat().st_size for p in paths)


def test_a_bad_member_is_one_line_naming_it(tmp_path, capsys):
    paths = _as_ranks(GPT2, [0, 1, 2], tmp_path / "t")
    text = paths[1].read_bytes()
    paths[1].write_bytes(text[: len(text) // 2])  # cut mid-trace: invalid JSON
    args = ["import", *map(str, paths), "-o", str(tmp_path / "p"), "-q", "--memory-budget", "1M"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(paths[1]) in err
    assert not (tmp_path / "p").exists()

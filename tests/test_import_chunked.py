"""The chunked import (a trace whose mapping would not fit the budget, mapped a stretch of time
at a time and merged) writes the same profile as the in-memory import, on every trace in
tests/data and on real traces repeated into many steps; its chunks never split what the
mapping joins; a bad trace is one line naming it."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA
from test_import_streaming import BIG, TRACES, _plain_forms, _same_profile

from neuron_explorer.errors import BadInputError
from neuron_explorer.importers import (
    import_traces,
    kineto_chunk_map,
    kineto_chunked,
    kineto_pieces,
    kineto_plan_spans,
)
from neuron_explorer.importers.kineto_chunked import (
    MAPPING_BYTES_PER_EVENT,
    MIN_CHUNKED_TEXT,
    chunked,
)
from neuron_explorer.importers.kineto_extract import DecodeOptions
from neuron_explorer.importers.kineto_merge import READ_ROWS, RUN_KEY, Run, global_ids
from neuron_explorer.importers.kineto_plan import plan
from neuron_explorer.model.profile import Profile

CHUNK_BUDGET = 16_000  # bytes: 100 events a chunk, so every trace with gaps is cut
MEMORY_BUDGET = 1 << 20
GPT2 = DATA / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz"
ALEXNET = (
    DATA / "kineto-gpu" / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
)
STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _chunked(trace: Path, out: Path) -> Path:
    return import_traces([trace], out, memory_budget=MEMORY_BUDGET, chunk_budget=CHUNK_BUDGET)


@pytest.mark.parametrize(
    "trace",
    [pytest.param(t, marks=pytest.mark.sweep) if t.stat().st_size > BIG else t for t in TRACES],
    ids=lambda p: p.name[:40],
)
def test_chunked_import_equals_the_in_memory_one(trace, tmp_path):
    _same_profile(_chunked(trace, tmp_path / "c"), import_traces([trace], tmp_path / "m"))


def test_plain_and_array_forms_import_in_chunks(tmp_path):
    for i, path in enumerate(_plain_forms(tmp_path, GPT2)):
        chunked_profile = _chunked(path, tmp_path / f"c{i}")
        _same_profile(chunked_profile, import_traces([path], tmp_path / f"m{i}"))


def _repeated(trace: Path, copies: int, path: Path) -> Path:
    """The trace's events `copies` times one after the other (times, correlation and flow ids
    and step numbers shifted): a real trace of many steps, hence many chunks."""
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    events = doc["traceEvents"]
    times = [e["ts"] + e.get("dur", 0) for e in events if "ts" in e]
    span = max(times) - min(times) + 1000
    out = []
    for k in range(copies):
        for e in events:
            if e.get("ph") == "M" and k:
                continue
            e = json.loads(json.dumps(e))
            if "ts" in e:
                e["ts"] += k * span
            if isinstance(e.get("id"), int):
                e["id"] += k * 1_000_000
            args = e.get("args") or {}
            if isinstance(args.get("correlation"), int):
                args["correlation"] += k * 1_000_000
            m = STEP.match(str(e.get("name", "")))
            if m:
                e["name"] = f"ProfilerStep#{int(m[1]) + k * 1000}"
            out.append(e)
    doc["traceEvents"] = out
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("trace", [GPT2, ALEXNET], ids=["gpt2-stacks", "alexnet-gpu"])
def test_many_chunks_merge_into_the_same_profile(trace, tmp_path):
    path = _repeated(trace, 6, tmp_path / "t.json")
    chunks = plan(
        path, CHUNK_BUDGET // MAPPING_BYTES_PER_EVENT, 1 << 16, lambda f, n=None: None, tmp_path
    )
    assert chunks.chunks >= 6
    got, want = _chunked(path, tmp_path / "c"), import_traces([path], tmp_path / "m")
    _same_profile(got, want)
    manifest = "manifest.json"
    assert json.loads((got / manifest).read_text()) == json.loads((want / manifest).read_text())


def test_chunks_mapped_in_worker_processes_merge_into_the_same_profile(tmp_path, monkeypatch):
    """A big trace's chunks are mapped by worker processes, one per CPU, in turn (here any
    trace's): the same profile as mapping them here."""
    monkeypatch.setattr(kineto_chunk_map, "POOL_MIN_BYTES", 0)
    path = _repeated(ALEXNET, 6, tmp_path / "t.json")
    _same_profile(_chunked(path, tmp_path / "c"), import_traces([path], tmp_path / "m"))


def test_a_chunk_holds_at_most_max_chunk_events_whatever_the_budget(tmp_path, monkeypatch):
    """A budget's share of a worker is cut to MAX_CHUNK_EVENTS (larger chunks cost fresh pages,
    not less work): more chunks, the same profile."""
    path = _repeated(ALEXNET, 6, tmp_path / "t.json")
    seen: list[int] = []
    route = kineto_chunked.route_spans

    def routed(*args, **kwargs):
        chunks = route(*args, **kwargs)
        seen.append(len(chunks))
        return chunks

    monkeypatch.setattr(kineto_chunked, "route_spans", routed)
    budget = 40 * CHUNK_BUDGET  # 4,000 events a chunk

    def chunked_at(out: Path) -> Path:
        return import_traces([path], out, memory_budget=MEMORY_BUDGET, chunk_budget=budget)

    chunked_at(tmp_path / "a")
    monkeypatch.setattr(kineto_chunked, "MAX_CHUNK_EVENTS", 100)
    got = chunked_at(tmp_path / "b")
    assert seen[1] > seen[0]
    _same_profile(got, import_traces([path], tmp_path / "m"))


def test_chunks_split_only_where_no_host_event_is_open(tmp_path):
    """No host row of a lane with others and no forward -> backward link reaches across a
    bound: what the mapping nests and links stays in one chunk."""
    path = _repeated(GPT2, 4, tmp_path / "t.json")
    p = plan(
        path, CHUNK_BUDGET // MAPPING_BYTES_PER_EVENT, 1 << 16, lambda f, n=None: None, tmp_path
    )
    assert p.chunks >= 4
    profile = Profile.open(import_traces([path], tmp_path / "m"))
    ev = profile.table("events")
    base = json.loads(path.read_text()).get("baseTimeNanoseconds") or 0
    start = ev["start_ns"].to_numpy() + (profile.manifest.origin_unix_ns - base)
    end = start + ev["dur_ns"].to_numpy()
    host = np.array(ev["layer"].to_pylist()) == "host"
    track = np.array(ev["track"].to_pylist())
    lanes, count = np.unique(track[host], return_counts=True)
    nesting = host & np.isin(track, lanes[count > 1])  # a lane of one row nests nothing
    for bound in p.bounds[1:]:
        assert not ((start[nesting] < bound) & (end[nesting] >= bound)).any()
    chunk = p.chunk_of_time(start)
    ids = ev["id"].to_numpy()
    flow = np.array([-1 if f is None else f for f in ev["flow_id"].to_pylist()])
    linked = host & (flow >= 0)
    row_of = np.searchsorted(ids, flow[linked])  # ids are the rows' positions in order
    assert linked.sum() > 50
    assert (chunk[row_of] == chunk[linked]).all()


def test_only_big_traces_or_a_chunk_budget_take_the_chunked_path():
    assert not chunked(GPT2, DecodeOptions(memory_budget=MEMORY_BUDGET))  # under MIN_CHUNKED_TEXT
    assert chunked(GPT2, DecodeOptions(memory_budget=2 << 30, chunk_budget=CHUNK_BUDGET))
    assert not chunked(GPT2, DecodeOptions(memory_budget=None))
    assert MIN_CHUNKED_TEXT * 0.6 < 2 << 30  # a 2 GB budget chunks traces over about 3.5 GB


def test_a_bad_trace_in_chunks_is_named_as_the_in_memory_import_names_it(tmp_path):
    path = _repeated(ALEXNET, 3, tmp_path / "t.json")
    doc = json.loads(path.read_text())
    late = [i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X"][-5]
    del doc["traceEvents"][late]["ts"]  # found by the mapping of a later chunk, not the first pass
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInputError) as chunks:
        _chunked(path, tmp_path / "c")
    with pytest.raises(BadInputError) as whole:
        import_traces([path], tmp_path / "m")
    assert str(chunks.value) == str(whole.value) and f"event #{late} " in str(whole.value)
    assert not (tmp_path / "c").exists()
    path.write_bytes(path.read_bytes()[:-1000])  # truncated: the first pass's error
    with pytest.raises(BadInputError, match=f"^{re.escape(str(path))}: "):
        _chunked(path, tmp_path / "c")


@pytest.fixture
def in_spans(monkeypatch):
    """Every chunked import's first two passes over three spans of the file, read in parallel
    (a gzip trace stays one span)."""
    monkeypatch.setattr(kineto_plan_spans, "MIN_SPAN_BYTES", 1)
    monkeypatch.setattr(kineto_chunked, "default_workers", lambda: 3)


@pytest.mark.parametrize(
    "trace",
    [pytest.param(t, marks=pytest.mark.sweep) if t.stat().st_size > BIG else t for t in TRACES],
    ids=lambda p: p.name[:40],
)
def test_the_passes_over_spans_give_the_in_memory_profile(trace, tmp_path, in_spans):
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress(trace.read_bytes()) if trace.suffix == ".gz" else
                      trace.read_bytes())  # fmt: skip
    _same_profile(_chunked(plain, tmp_path / "c"), import_traces([trace], tmp_path / "m"))


@pytest.mark.parametrize("trace", [GPT2, ALEXNET], ids=["gpt2-stacks", "alexnet-gpu"])
def test_a_plan_over_spans_is_the_plan_over_the_whole_file(trace, tmp_path, in_spans):
    path = _repeated(trace, 6, tmp_path / "t.json")
    spans = kineto_plan_spans.spans_of(path, 3)
    assert len(spans) == 3
    (tmp_path / "s").mkdir()
    (tmp_path / "w").mkdir()
    events = CHUNK_BUDGET // MAPPING_BYTES_PER_EVENT
    got = kineto_plan_spans.plan_spans(
        path, events, 1 << 16, lambda f, n=None: None, tmp_path / "s", 3
    )
    want = plan(path, events, 1 << 16, lambda f, n=None: None, tmp_path / "w")
    assert got.chunks >= 6 and len(got.spans) == 3
    assert (got.bounds == want.bounds).all()
    assert (got.launch_corr == want.launch_corr).all()
    assert (got.launch_chunk == want.launch_chunk).all()
    assert got.samples_first == want.samples_first and got.events == want.events
    assert sorted(got.frame_codes, key=got.frame_codes.get) == sorted(
        want.frame_codes, key=want.frame_codes.get
    )
    keys = b"".join(k.read_bytes() for k in got.keys)
    assert keys == want.keys[0].read_bytes()


def test_a_bad_trace_read_in_spans_is_one_line_naming_it(tmp_path, in_spans):
    """A span that does not decode makes the first pass read the whole file here: the same
    one-line error as without spans."""
    path = _repeated(ALEXNET, 3, tmp_path / "t.json")
    assert len(kineto_plan_spans.spans_of(path, 3)) == 3
    path.write_bytes(path.read_bytes()[:-1000])  # truncated: the last span's error
    with pytest.raises(BadInputError, match=f"^{re.escape(str(path))}: invalid JSON"):
        _chunked(path, tmp_path / "c")


def test_the_first_pass_keeps_every_event_decoded_once_in_order(tmp_path, in_spans):
    """The first pass's records (each range's columns, which the chunks' mapping reads instead
    of decoding the text again) hold every event of the trace once, in its order, each with
    the values its own codes name."""
    path = _repeated(GPT2, 3, tmp_path / "t.json")
    events = json.loads(path.read_bytes())["traceEvents"]
    p = kineto_plan_spans.plan_spans(path, 100, 1 << 14, lambda f, n=None: None, tmp_path, 3)
    assert len(p.records) == 3
    records = [r for part in p.records for r in kineto_pieces.read_all(part)]
    assert len(records) > 20 and sum(r.n for r in records) == p.events == len(events)
    for field, default in (("name", ""), ("ph", ""), ("tid", 0)):
        got = [r.values[field][c] for r in records for c in r.codes[field].tolist()]
        assert got == [e.get(field, default) for e in events], field


def test_progress_counts_every_event_over_spans_as_the_stream_does(tmp_path, in_spans):
    def counted(**budgets) -> list[int]:
        seen: list[int] = []

        def progress(stage, fraction, events=None, bytes_read=None):
            if events is not None:
                seen.append(events)

        out = tmp_path / f"p{len(budgets)}"
        import_traces([path], out, memory_budget=MEMORY_BUDGET, progress=progress, **budgets)
        return seen

    path = _repeated(GPT2, 6, tmp_path / "t.json")
    streamed, in_chunks = counted(), counted(chunk_budget=CHUNK_BUDGET)
    assert in_chunks == sorted(in_chunks) and in_chunks[-1] == streamed[-1] > 5 * 2949


@pytest.mark.parametrize("layout", ["disjoint", "overlapping", "one run"])
def test_the_merge_gives_each_row_its_place_among_every_runs_rows(tmp_path, layout):
    """Each run's rows get their positions in the sort of every run's keys together: runs in
    stretches of time one after another (numbered a run at a time), interleaved with equal
    starts and durations (ties broken by the trace index), over several read blocks."""
    rng = np.random.default_rng(7)
    sizes = {"disjoint": [3 * READ_ROWS + 5, 17, 0, READ_ROWS], "one run": [2 * READ_ROWS + 1],
             "overlapping": [READ_ROWS + 3, 2 * READ_ROWS, 500, READ_ROWS // 2]}[layout]  # fmt: skip
    runs, keys, tie = [], [], rng.permutation(sum(sizes))
    for i, n in enumerate(sizes):
        key = np.empty(n, RUN_KEY)
        base = i * 10**9 if layout == "disjoint" else 0
        key["start"] = base + rng.integers(0, 2000, n)
        key["ndur"] = -rng.integers(0, 3, n)
        key["tie"] = tie[sum(sizes[:i]) : sum(sizes[: i + 1])]
        key.sort(order=["start", "ndur", "tie"])
        path = tmp_path / f"run{i}.keys"
        key.tofile(path)
        runs.append(Run(path, path, n))
        keys.append(key)
    every = np.concatenate(keys)
    place = np.empty(len(every), np.int64)
    place[np.lexsort((every["tie"], every["ndur"], every["start"]))] = np.arange(len(every))
    got = global_ids(runs)
    assert np.array_equal(np.concatenate(got), place)
    assert all(np.all(np.diff(ids) > 0) for ids in got)

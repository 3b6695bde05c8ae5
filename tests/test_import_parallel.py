"""The Kineto importer's decoding in ranges and in several processes gives exactly the tables of
decoding the whole file at once, on the real traces; a cut that is not between two events is
caught, and a bad file fails in one line whichever way it is decoded."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import kineto_trace_paths

from neuron_explorer.errors import BadInputError
from neuron_explorer.importers import kineto, kineto_parallel
from neuron_explorer.importers.assemble import write_profile
from neuron_explorer.importers.kineto_extract import DecodeOptions
from neuron_explorer.importers.kineto_ranges import BufferSource, RangeError, decode_span
from neuron_explorer.model.io import ProfileWriter

TRACES = kineto_trace_paths()
WHOLE = DecodeOptions(workers=1, range_bytes=1 << 40)  # the whole file in one decode
RANGES = DecodeOptions(workers=1, range_bytes=64 << 10)
PARALLEL = DecodeOptions(workers=2, range_bytes=64 << 10, parallel_min_bytes=0)
TINY = DecodeOptions(workers=1, range_bytes=4 << 10)  # hundreds of ranges
THREE = DecodeOptions(workers=3, range_bytes=32 << 10, parallel_min_bytes=0)

needs_fork = pytest.mark.skipif(not kineto_parallel.available(), reason="needs fork and memfd")


def _import(path: Path, out: Path, options: DecodeOptions) -> dict[str, pq.ParquetFile]:
    with ProfileWriter(out) as writer:
        write_profile([kineto.load(path, options=options)], out, writer=writer)
    return {t: pq.read_table(out / f"{t}.parquet") for t in ("events", "stacks", "counters")}


@needs_fork
@pytest.mark.parametrize("name", sorted(TRACES))
@pytest.mark.parametrize("options", [RANGES, PARALLEL, THREE], ids=["ranges", "two", "three"])
def test_ranges_and_processes_give_the_whole_file_tables(tmp_path, name, options):
    whole = _import(TRACES[name], tmp_path / "whole", WHOLE)
    cut = _import(TRACES[name], tmp_path / "cut", options)
    for table, expected in whole.items():
        assert cut[table].num_rows == expected.num_rows, table
        assert cut[table].equals(expected), table


def _plain(tmp_path: Path, name: str) -> Path:
    """A shared trace gunzipped (plain files are read range by range from disk)."""
    out = tmp_path / f"{name}.json"
    out.write_bytes(gzip.decompress(TRACES[name].read_bytes()))
    return out


@needs_fork
def test_a_plain_file_in_two_processes_matches_the_gzip_one(tmp_path):
    plain = _plain(tmp_path, "alexnet")
    a = _import(plain, tmp_path / "plain", PARALLEL)
    b = _import(TRACES["alexnet"], tmp_path / "gz", WHOLE)
    assert all(a[t].equals(b[t]) for t in a)


def test_a_cut_inside_a_string_is_caught():
    text = gzip.decompress(TRACES["alexnet"].read_bytes())
    # an args string holding an event separator, in the middle of the file
    at = text.index(b'"args": {', len(text) // 2) + len(b'"args": {')
    text = text[:at] + b'"note": "a}, {b", ' + text[at:]
    cut = text.index(b"}, {b") + 1
    source = BufferSource(bytearray(text))
    with pytest.raises(RangeError):
        decode_span(source, None, cut)
    with pytest.raises(RangeError):
        decode_span(source, cut, None)


def _replace_after(text: bytes, at: int, old: bytes, new: bytes) -> bytes:
    i = text.index(old, at)
    return text[:i] + new + text[i + len(old) :]


@needs_fork
@pytest.mark.parametrize("options", [TINY, PARALLEL], ids=["ranges", "two"])
def test_event_separators_inside_strings_do_not_change_the_tables(tmp_path, options):
    # every args object starts with a string holding "}, {": some of the cuts the ranges look
    # for first sit inside a string, and must be caught and replaced by sound ones
    text = gzip.decompress(TRACES["alexnet"].read_bytes())
    trace = tmp_path / "strings.json"
    trace.write_bytes(text.replace(b'"args": {', b'"args": {"note": "}, {", '))
    whole = _import(trace, tmp_path / "whole", WHOLE)
    cut = _import(trace, tmp_path / "cut", options)
    assert all(cut[t].equals(whole[t]) for t in whole)
    assert whole["events"].num_rows > 500


@needs_fork
@pytest.mark.parametrize(
    "damage",
    [
        lambda t: t[: len(t) * 3 // 4],  # truncated in the second half
        lambda t: t[: len(t) * 3 // 4] + b"}{" + t[len(t) * 3 // 4 :],  # garbage there
        lambda t: _replace_after(t, t.index(b'"ph": "X"', len(t) * 3 // 4), b'"ts"', b'"tz"'),
    ],
    ids=["truncated", "garbage", "no-ts"],
)
def test_bad_files_fail_in_one_line_the_same_way(tmp_path, damage):
    bad = tmp_path / "bad.json"
    bad.write_bytes(damage(gzip.decompress(TRACES["alexnet"].read_bytes())))
    errors = []
    for options in (WHOLE, PARALLEL):
        with pytest.raises(BadInputError) as e:
            kineto.load(bad, options=options)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    assert "\n" not in errors[0]


@pytest.mark.parametrize("overlap", [False, True], ids=["in turn", "encoded in a thread"])
def test_events_written_in_blocks_equal_a_sorted_write(tmp_path, overlap):
    """The importer writes events a row group at a time, in order (each encoded while the next
    is made, with `overlap`: the same bytes); the result reads back as write_events' sorted
    table does, and blocks out of order are refused."""
    events = _import(TRACES["ns_resolution"], tmp_path / "p", WHOLE)["events"]
    shuffled = events.take(list(range(events.num_rows))[::-1])
    with ProfileWriter(tmp_path / "sorted") as w:
        w.write_events(shuffled)
        sorted_table = pq.read_table(w.tmp / "events.parquet")
    step = 1000
    blocks = [events.slice(i, step) for i in range(0, events.num_rows, step)]
    with ProfileWriter(tmp_path / "blocks") as w:
        w.write_events_in_order(blocks, overlap=overlap)
        assert pq.read_table(w.tmp / "events.parquet").equals(sorted_table)
        written = (w.tmp / "events.parquet").read_bytes()
    with ProfileWriter(tmp_path / "one_by_one") as w:
        w.write_events_in_order(blocks)
        assert (w.tmp / "events.parquet").read_bytes() == written
    with ProfileWriter(tmp_path / "bad") as w, pytest.raises(ValueError, match="order"):
        w.write_events_in_order(blocks[:3] + blocks[::-1], overlap=overlap)


@pytest.mark.parametrize("name", ["ns_resolution", "nccl", "cpu_mlp"])
def test_nesting_by_pointer_jumping_equals_the_sparse_table_descent(name):
    """Host nesting jumps pointers for as many rounds as the nesting is deep, then hands what
    is left to a sparse-table descent: both searches give the same containers on real traces."""
    from neuron_explorer.vocab import intervals as nesting

    cols = kineto.load(TRACES[name], options=WHOLE).columns
    rows = np.arange(len(cols["start_ns"]))  # layer and track are made per block of rows
    host = cols["layer"].take(rows).indices.to_numpy(zero_copy_only=False) == 0
    track = cols["track"].take(rows).indices.to_numpy(zero_copy_only=False)[host]
    start, end = cols["start_ns"][host], cols["start_ns"][host] + cols["dur_ns"][host]
    order = nesting._track_start_order(track, start, end)
    e, s = end[order], start[order]
    need = e + (e <= s)
    every = np.arange(len(e))
    jumped = nesting._previous_container(e, need)
    assert (jumped >= 0).sum() > len(e) // 2
    assert np.array_equal(jumped, nesting._descend(e, need, every, every.copy()))

"""A timeline window's rectangles merged in numpy (analysis/timeline.py `_reduce`) are those the
DuckDB query gave (`_reduce_sql`, kept for the sums it refuses), row for row and in order, on
real traces and captures at several bucket widths, and on a table of names with nulls."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from test_analysis_profiles import real, sample

from neuron_explorer.analysis.timeline import _reduce, _reduce_sql
from neuron_explorer.analysis.timeline_index import build_index, lanes_and_depths

PROFILES = ["alexnet", "nccl", "sample:gpt_train", "sample:ddp_straggler"]


def _keys(t: pa.Table, lane, depth, start_ns: int, bucket_ns: float, width_px: int):
    """window()'s `small` and `key` for one bucket width."""
    start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
    small = dur < bucket_ns
    bucket = np.floor((np.maximum(start, start_ns) - start_ns) / bucket_ns).astype(np.int64)
    key = (lane.astype(np.int64) * 128 + np.minimum(depth, 127)) * (width_px * 2 + 4) + bucket
    return small, key


@pytest.mark.parametrize("name", PROFILES)
def test_the_numpy_merge_is_the_sql_merge(name):
    p = sample(name[7:]) if name.startswith("sample:") else real(name)
    idx = build_index(p)
    ext = idx.end_ns - idx.start_ns
    merged = 0
    for a, b in ((0.0, 1.0), (0.2, 0.5), (0.61, 0.62)):
        s, e = idx.start_ns + int(a * ext), idx.start_ns + int(b * ext)
        t, lane, depth = lanes_and_depths(p, idx, s, e)
        for px, factor in ((1500, 1), (300, 4), (80, 64)):
            small, key = _keys(t, lane, depth, s, (e - s) / px * factor, px)
            got = _reduce(None, t, lane, depth, small, key)
            assert got.to_pylist() == _reduce_sql(None, t, lane, depth, small, key).to_pylist()
            merged += sum(c > 1 for c in got.column("count").to_pylist())
    assert merged  # groups of several events compared, not only events drawn alone


def test_names_with_nulls_merge_as_sql_counts_distinct_names():
    """One name among nulls keeps it (count(DISTINCT) ignores nulls), two names or only nulls
    give "N events"; kind and id of the longest, then lowest id."""
    names = ["a", None, "a", None, None, "a", "b", "c"]
    t = pa.table({
        "id": pa.array([5, 3, 9, 1, 2, 7, 8, 4], pa.int64()),
        "start_ns": pa.array([0, 10, 20, 100, 110, 200, 210, 300], pa.int64()),
        "dur_ns": pa.array([5, 9, 9, 3, 3, 4, 4, 500], pa.int64()),
        "name": pa.array(names, pa.string()).dictionary_encode(),
        "kind": pa.array(["op", "x", "y", "op", "k", "op", "op", "kernel"]),
    })  # fmt: skip
    lane, depth = np.zeros(8, np.int32), np.zeros(8, np.int32)
    small = t.column("dur_ns").to_numpy() < 100
    key = np.array([0, 0, 0, 1, 1, 2, 2, 3], np.int64)
    got = _reduce(None, t, lane, depth, small, key)
    assert got.to_pylist() == _reduce_sql(None, t, lane, depth, small, key).to_pylist()
    assert got.column("name").to_pylist() == ["a", "2 events", "2 events", "c"]
    assert got.column("id").to_pylist() == [3, 1, 7, 4] and got.column("kind")[0].as_py() == "x"

"""Issue 31, the events of a short span read by row group (analysis/event_groups.py): a
timeline window read that way holds the very rows, in the same order and types, that a dataset
scan with window_events' filter gives, on profiles cut into small row groups (one rank, and two
ranks whose groups overlap in time); a span over more groups than it reads is left to the scan."""

from __future__ import annotations

import shutil

import hostile_sizes
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from test_analysis_profiles import real, sample

from neuron_explorer.analysis.event_groups import GROUP_READS, read_starting, row_groups
from neuron_explorer.analysis.timeline_index import WINDOW_COLUMNS, window_events
from neuron_explorer.analysis.timeline_stream import build_index_streamed
from neuron_explorer.model.profile import Profile

SPANS = [(0.0, 0.001), (0.2, 0.2005), (0.31, 0.33), (0.5, 0.5 + 1e-9), (0.75, 0.9), (0.0, 1.0)]


def _in_small_groups(src: Profile, dst, rows: int) -> Profile:
    """A copy of `src` whose events files (one, or one a rank) are written `rows` to a group."""
    shutil.copytree(src.path, dst)
    single = dst / "events.parquet"
    for f in [single] if single.exists() else sorted((dst / "events").rglob("*.parquet")):
        hostile_sizes._rewrite(f, pq.read_table(f), rows)
    return Profile.open(dst)


def _scanned(p: Profile, idx, s: int, e: int):
    """window_events' rows as one dataset scan with its filter reads them (the reference)."""
    thr = idx.long_threshold_ns
    short = p.table("events", columns=WINDOW_COLUMNS, filter=(
        (pc.field("start_ns") < e) & (pc.field("start_ns") >= s - max(thr, 0))
        & (pc.field("dur_ns") <= thr) & ((pc.field("start_ns") + pc.field("dur_ns")) >= s)
    ))  # fmt: skip
    le = idx.long_events
    long = le.filter(pc.and_(pc.less(le.column("start_ns"), e),
                             pc.greater_equal(pc.add(le.column("start_ns"), le.column("dur_ns")), s)))  # fmt: skip
    return short.cast(le.schema).to_pylist() + long.to_pylist()


@pytest.mark.parametrize("name", ["alexnet", "sample:ddp_straggler"])
def test_a_span_read_by_row_group_holds_the_rows_a_scan_reads(name, tmp_path):
    src = sample(name[7:]) if name.startswith("sample:") else real(name)
    p = _in_small_groups(src, tmp_path / "p", max(5, src.row_count("events") // 200))
    assert len(row_groups(p)) > 4 * GROUP_READS
    idx = build_index_streamed(p)
    ext = idx.end_ns - idx.start_ns
    read = scanned = 0
    for a, b in SPANS:
        s, e = idx.start_ns + int(a * ext), idx.start_ns + max(int(b * ext), 1)
        got = window_events(p, idx, s, e)
        assert got.schema == idx.long_events.schema
        assert got.to_pylist() == _scanned(p, idx, s, e)
        if read_starting(p, WINDOW_COLUMNS, s - max(idx.long_threshold_ns, 0), e) is None:
            scanned += 1  # over GROUP_READS groups: the scan read it
        else:
            read += 1
    assert read >= 2 and scanned >= 1


def test_a_span_names_only_the_groups_that_may_hold_it(tmp_path):
    """Every row read starts in a group whose statistics overlap the span, and no row of the
    profile starting in the span is missed."""
    p = _in_small_groups(real("alexnet"), tmp_path / "p", 16)
    t = p.table("events", columns=["id", "start_ns"])
    start = t.column("start_ns").to_numpy()
    ordered = sorted(start.tolist())
    lo, hi = ordered[len(ordered) // 2], ordered[len(ordered) // 2 + 40]  # about 40 events
    got = read_starting(p, ["id", "start_ns"], lo, hi, max_groups=10_000)
    want = set(t.column("id").to_numpy()[(start >= lo) & (start < hi)].tolist())
    assert got is not None and want and want <= set(got.column("id").to_pylist())
    assert got.num_rows <= 40 + 2 * 16  # only the groups of the span
    assert read_starting(p, ["id", "start_ns"], lo, hi, max_groups=0) is None

"""Issue 31, timeline windows of a huge profile from a level-of-detail pyramid: on real traces
(tests/data) and two-rank captures, with levels scaled to the profile, a window merged from the
pyramid counts every event once, draws alone the events window() draws alone, and merges the
rest inside the window on window()'s lanes and depths; the pyramid built in small batches is the
one built in one; a service builds it in its warm-up and a second one reads it back."""

from __future__ import annotations

import hostile_sizes
import numpy as np
import pyarrow as pa
import pytest
from test_analysis_profiles import real, sample

from neuron_explorer.analysis.timeline import lod_window, window
from neuron_explorer.analysis.timeline_index import lanes_and_depths
from neuron_explorer.analysis.timeline_lod_build import build_pyramid, default_buckets
from neuron_explorer.analysis.timeline_stream import build_index_streamed
from neuron_explorer.model.profile import Profile

PROFILES = ["alexnet", "nccl", "sample:gpt_train", "sample:ddp_straggler"]
SHIFTS = (12, 10, 8, 6)  # extent / 4096 .. / 64: windows of a few % at 200-1500 px use them
WINDOWS = [(0.0, 1.0, 1500), (0.1, 0.45, 800), (0.3, 0.34, 200), (0.52, 0.9, 333), (0.7, 0.75, 64)]


def _profile(name: str) -> Profile:
    return sample(name[7:]) if name.startswith("sample:") else real(name)


def _check(p, idx, pyr, s, e, px) -> int | None:
    """The pyramid's window of [s, e) against the events window() reads; its level."""
    win = lod_window(p, idx, pyr, s, e, px)
    ref = window(p, idx, s, e, px)
    if win is None:
        assert min(pyr.buckets) > (e - s) / max(px, 50)  # no level a pixel wide or finer
        return None
    assert win.events == ref.events  # every event overlapping the window counted once
    r = win.rects.columns
    assert sum(r["count"]) == win.events
    t, lane, depth = lanes_and_depths(p, idx, s, e)
    dur = t.column("dur_ns").to_numpy()
    alone = dur >= win.bucket_ns
    want = sorted(zip(t.column("id").to_numpy()[alone].tolist(), lane[alone].tolist(),
                      depth[alone].tolist(), strict=True))  # fmt: skip
    rows = list(zip(r["id"], r["lane"], r["depth"], r["dur_ns"], r["count"], strict=True))
    got = sorted((i, ln, d) for i, ln, d, du, c in rows if c == 1 and du >= win.bucket_ns)
    assert got == want  # drawn alone: the same events, on the same lanes and depths
    cells = set(zip(lane[~alone].tolist(), np.minimum(depth[~alone], 127).tolist(), strict=True))
    for st, du, ln, d, c in zip(r["start_ns"], r["dur_ns"], r["lane"], r["depth"], r["count"],
                                strict=True):  # fmt: skip
        assert st < e and st + du >= s  # within the window
        if c > 1 or du < win.bucket_ns:
            assert (ln, d) in cells  # merged on a lane and depth window() merges on
    assert win.rects_count <= 4000 and win.lod_level is not None
    return win.lod_level


@pytest.mark.parametrize("name", PROFILES)
def test_a_window_from_the_pyramid_counts_and_draws_what_window_does(name):
    p = _profile(name)
    idx = build_index_streamed(p)
    pyr = build_pyramid(p, idx, default_buckets(idx, SHIFTS))
    ext = idx.end_ns - idx.start_ns
    levels = set()
    for a, b, px in WINDOWS:
        s, e = idx.start_ns + int(a * ext), idx.start_ns + int(b * ext)
        levels.add(_check(p, idx, pyr, s, e, px))
    assert len(levels - {None}) >= 2  # several levels answered


@pytest.mark.parametrize("name", ["alexnet", "sample:ddp_straggler"])
def test_the_pyramid_built_in_small_batches_is_the_one_built_in_one(name):
    """In batches of 97 rows or in one, from the index's rows or the events' lane columns."""
    p = _profile(name)
    idx = build_index_streamed(p)
    buckets = default_buckets(idx, SHIFTS)
    whole = build_pyramid(p, idx, buckets, batch_size=1 << 22)
    small = build_pyramid(p, idx, buckets, batch_size=97, compact_rows=50)
    assert whole.rows.num_rows > 0 and whole.rows.equals(small.rows)
    # from the index's per-row lanes and depths, or from the lane columns and parents: one
    assert len(idx.row_lane) == p.row_count("events")
    read = build_pyramid(p, build_index_streamed(p, rows=False), buckets, batch_size=97)
    assert whole.rows.equals(read.rows)
    assert whole.rows.column("count").to_numpy().sum() > p.row_count("events")  # a level each


@pytest.mark.parametrize("name", ["alexnet", "sample:ddp_straggler"])
def test_a_pyramid_over_its_bytes_keeps_its_coarsest_levels_and_counts_every_event(name):
    """What the build holds is bounded (the server admits it at that): past the bound the
    finest levels left are dropped, the others are the unbounded pyramid's, renumbered, and
    every window still counts window()'s events (from a coarser level, or read as events)."""
    p = _profile(name)
    idx = build_index_streamed(p)
    buckets = default_buckets(idx, SHIFTS)
    whole = build_pyramid(p, idx, buckets)
    bounded = build_pyramid(p, idx, buckets, batch_size=97, max_bytes=whole.rows.nbytes)
    dropped = len(buckets) - len(bounded.buckets)
    assert 0 < dropped < len(buckets) and bounded.buckets == whole.buckets[dropped:]
    level = whole.rows.column("level").to_numpy()
    rest = whole.rows.filter(pa.array(level >= dropped))
    rest = rest.set_column(0, "level", pa.array(level[level >= dropped] - dropped, pa.int8()))
    assert bounded.rows.equals(rest)
    ext = idx.end_ns - idx.start_ns
    for a, b, px in WINDOWS:
        s, e = idx.start_ns + int(a * ext), idx.start_ns + int(b * ext)
        _check(p, idx, bounded, s, e, px)
    none = build_pyramid(p, idx, buckets, max_bytes=1)  # no level fits: windows read events
    assert none.buckets == () and none.rows.num_rows == 0
    assert lod_window(p, idx, none, idx.start_ns, idx.end_ns, 1500) is None


def test_a_service_builds_the_pyramid_in_its_warm_up_and_a_second_reads_it_back(tmp_path):
    """A 200,000-event profile over the service's ceiling: warm_up builds the pyramid; a wide
    window is merged from it (counting window()'s events), a narrow one reads events; a second
    service on the same disk cache answers from the pyramid without building it."""
    root = tmp_path / "profiles"
    hostile_sizes.base_profile(root / "big", 200_000)

    def service():
        return _streamed_service(root, tmp_path / "cache")

    svc = service()
    assert svc.pyramid("big", build=False) is None
    svc.warm_up()
    pyr = svc.pyramid("big", build=False)
    assert pyr is not None
    p, idx = svc.store.open("big"), svc.index("big")
    s, e = idx.start_ns, idx.start_ns + (idx.end_ns - idx.start_ns) // 2
    win = svc.window("big", s, e, 1000)
    assert win.lod_level is not None and win.events == window(p, idx, s, e, 1000).events
    narrow = svc.window("big", s, s + (e - s) // 1000, 1000)
    assert narrow.lod_level is None  # few events: read as today
    again = service()
    kept = again.pyramid("big", build=False)  # on disk: read back, not built
    assert kept is not None and kept.rows.equals(pyr.rows) and kept.buckets == pyr.buckets
    assert again.window("big", s, e, 1000).to_dict() == win.to_dict()


def _streamed_service(root, cache):
    """A service whose index of profile `big` is streamed (over its ceiling whole), then given
    room: a profile this small is over a ceiling only just above what the process holds, which
    the steps after the index would pass."""
    from neuron_explorer.web.memory import EVENT_BYTES, rss_bytes, trim
    from neuron_explorer.web.service import Service

    svc = Service(root, cache, max_memory=1 << 40)
    svc.lod_events, svc.lod_shifts = 5_000, SHIFTS
    p = svc.store.open("big")
    trim()
    svc.memory.limit = rss_bytes() + p.footer_rows["events"] * EVENT_BYTES  # + footers: over
    assert not len(svc.index("big").event_lane)  # streamed: windows read row groups
    svc.memory.limit = 1 << 40
    return svc


def test_a_restarted_service_shows_the_first_view_before_it_checks_the_values(tmp_path):
    """The first view of a profile over the ceiling, after a restart, comes from the disk cache
    (index and view) without the values' check (which reads every row group of its names); a
    window, which reads events, checks them first, and so does the warm-up."""
    root = tmp_path / "profiles"
    hostile_sizes.base_profile(root / "big", 20_000)
    first = _streamed_service(root, tmp_path / "cache")
    view = first.first_window("big")  # computed, kept on disk
    again = _streamed_service(root, tmp_path / "cache")
    p = again.store.open("big")
    assert again.first_window("big").to_dict() == view.to_dict()
    assert not p._values_checked  # nothing read from the tables
    idx = again.index("big")
    again.window("big", idx.start_ns, idx.start_ns + (idx.end_ns - idx.start_ns) // 7, 800)
    assert p._values_checked
    third = _streamed_service(root, tmp_path / "cache")
    third.warm_up()
    assert third.store.open("big")._values_checked


def test_a_cell_met_again_out_of_start_order_is_merged_once():
    """Cells of one key seen twice (a lane's events in two files) become one, counts summed."""
    from neuron_explorer.analysis.timeline_lod_build import _merge_repeated

    p = real("alexnet")
    idx = build_index_streamed(p)
    rows = build_pyramid(p, idx, default_buckets(idx, SHIFTS)).rows
    cells = rows.filter(rows.column("cell"))
    assert _merge_repeated(cells) is cells  # each key once: left as is
    twice = _merge_repeated(pa.concat_tables([cells, cells]))
    key = ["level", "lane", "depth", "bucket"]
    a, b = (
        cells.sort_by([(k, "ascending") for k in key]),
        twice.sort_by([(k, "ascending") for k in key]),
    )
    assert b.num_rows == a.num_rows
    assert b.column("count").to_pylist() == [2 * c for c in a.column("count").to_pylist()]
    for col in ("start_ns", "end_ns", "id", "name", "kind", "one"):
        assert b.column(col).to_pylist() == a.column(col).to_pylist()


def _merged_in_sql(rows: pa.Table, start_ns: int, bucket_ns: float, width_px: int) -> list:
    """The rows merged by the DuckDB query the pyramid's windows ran before they were merged in
    numpy (the reference: the same rectangles, in the same order)."""
    import duckdb

    start, bd = rows.column("start_ns").to_numpy(), rows.column("bd").to_numpy()
    lane, depth = rows.column("lane").to_numpy(), rows.column("depth").to_numpy()
    small = (bd < bucket_ns) | (rows.column("count").to_numpy() > 1)
    bucket = np.floor((np.maximum(start, start_ns) - start_ns) / bucket_ns).astype(np.int64)
    key = (lane.astype(np.int64) * 128 + np.minimum(depth, 127)) * (width_px * 2 + 4) + bucket
    con = duckdb.connect()
    con.register(
        "_r", rows.append_column("small", pa.array(small)).append_column("k", pa.array(key))
    )
    return (
        con.sql(
            "SELECT lane, depth, start_ns, end_ns - start_ns AS dur_ns, id, 1::BIGINT AS count, "
            "name, kind FROM _r WHERE NOT small UNION ALL "
            "SELECT any_value(lane), any_value(depth), min(start_ns), max(end_ns) - min(start_ns), "
            "arg_max(id, (bd, -id)), sum(count)::BIGINT, "
            "CASE WHEN bool_and(one) AND count(DISTINCT name) = 1 AND count(name) = count(*) "
            "THEN any_value(name) ELSE CAST(sum(count) AS VARCHAR) || ' events' END, "
            "arg_max(kind, (bd, -id)) FROM _r WHERE small GROUP BY k ORDER BY 1, 2, 3, 5"
        )
        .to_arrow_table()
        .to_pylist()
    )


@pytest.mark.parametrize("name", PROFILES)
def test_a_window_merged_in_numpy_is_the_sql_merge(name):
    """The pyramid's rows of each window (cells, wide rows, long events, edge events) merged in
    numpy give the rectangles, names and order the DuckDB merge gave."""
    from neuron_explorer.analysis.timeline_lod import _merge_window, level_for, pyramid_rows

    p = _profile(name)
    idx = build_index_streamed(p)
    pyr = build_pyramid(p, idx, default_buckets(idx, SHIFTS))
    ext = idx.end_ns - idx.start_ns
    merged = 0
    for a, b, px in WINDOWS:
        s, e = idx.start_ns + int(a * ext), idx.start_ns + int(b * ext)
        level = level_for(pyr, (e - s) / px)
        if level is None:
            continue
        rows = pyramid_rows(p, idx, pyr, level, s, e)
        n, bucket_ns, rects = _merge_window(rows, s, e, px, 4000)
        assert n == rows.column("count").to_numpy().sum()
        assert rects.to_pylist() == _merged_in_sql(rows, s, bucket_ns, px)
        merged += sum(c > 1 for c in rects.column("count").to_pylist())
    assert merged  # groups of several events were compared, not only rows drawn alone


@pytest.mark.parametrize("name", ["alexnet", "sample:ddp_straggler"])
def test_each_cells_longest_event_is_the_one_a_sort_by_duration_and_id_picks(name):
    """The build sorts a batch once by (lane, depth, start) and finds each cell's longest event
    (the lowest id among ties) by reductions: the event a sort by (cell, -duration, id) puts
    first, on every level's cells of real events (ties included: many share a duration)."""
    from neuron_explorer.analysis.timeline_lod_build import _longest

    p = _profile(name)
    idx = build_index_streamed(p)
    t = p.table("events", columns=["id", "start_ns", "dur_ns"])
    start, dur, ids = (t.column(c).to_numpy() for c in ("start_ns", "dur_ns", "id"))
    cell = idx.row_lane.astype(np.int64) * 128 + np.minimum(idx.row_depth, 127)
    by_cell = np.lexsort((start, cell))
    ties = 0
    for width in default_buckets(idx, SHIFTS):
        key = cell * (1 << 40) + ((start - idx.start_ns) // width).astype(np.int64)
        order = by_cell
        k = key[order]
        first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        want = np.lexsort((ids, -dur, key))
        kw = key[want]
        assert (
            _longest(order, first, dur, ids).tolist()
            == want[np.flatnonzero(np.r_[True, kw[1:] != kw[:-1]])].tolist()
        )
        run = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(order)]))
        longest = np.maximum.reduceat(dur[order], first)
        ties += int((np.bincount(run, dur[order] == longest[run]) > 1).sum())
    assert ties > 0  # cells whose longest duration is shared: the lowest id decides

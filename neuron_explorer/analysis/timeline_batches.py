"""A timeline window too big to hold in memory (the whole view of a profile over the server's
ceiling), reduced batch by batch to the rectangles analysis.timeline.window gives.

Pattern: a window's rectangles are few (MAX_RECTS) whatever the events. Algorithm: one pass
reduces each batch to partial groups (min start, max end, the longest event, the count, the
smallest and largest name) per (lane, depth, bucket), the bucket one pixel wide and doubled, as
window() doubles it, as soon as the groups and events held alone prove it gives too many
rectangles (a bucket 2^k pixels wide is the pixel >> k, so what is held is merged into it), and
the groups are merged at the end as window() merges.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from ..vocab.intervals import depths
from .event_groups import row_groups
from .search import _name_codes
from .timeline_index import (
    DRAWN_COLUMNS,
    END_LIMIT,
    WINDOW_COLUMNS,
    TimelineIndex,
    _ends,
    lane_of,
    long_rows,
    short_rows,
)
from .timeline_stream import BATCH_ROWS, OpenEvents, batches

COMPACT_ROWS = 1 << 16  # partial groups merged once this many pile up
_WIDE = pa.schema([("lane", pa.int32()), ("depth", pa.int32()), ("start_ns", pa.int64()),
                   ("dur_ns", pa.int64()), ("id", pa.int64()), ("count", pa.int64()),
                   ("name", pa.string()), ("kind", pa.string())])  # fmt: skip
_PARTIAL_SCHEMA = pa.schema([("k", pa.int64()), ("lane", pa.int32()), ("depth", pa.int32()),
                             ("s", pa.int64()), ("e", pa.int64()), ("bid", pa.int64()),
                             ("bkind", pa.string()), ("bd", pa.int64()), ("n", pa.int64()),
                             ("mn", pa.string()), ("mx", pa.string())])  # fmt: skip

_PARTIAL = (
    "SELECT k, any_value(lane) AS lane, any_value(depth) AS depth, min(s) AS s, max(e) AS e, "
    "arg_max(bid, (bd, -bid)) AS bid, arg_max(bkind, (bd, -bid)) AS bkind, max(bd) AS bd, "
    "sum(n)::BIGINT AS n, min(mn) AS mn, max(mx) AS mx FROM {src} GROUP BY k"
)


def window_rows(profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int) -> int:
    """Rows of the row groups a window reads (those whose start_ns statistics overlap it), from
    the Parquet footers: what a window would hold in memory, known before it reads a row."""
    lo = start_ns - max(index.long_threshold_ns, 0)
    rows = sum(n for least, most, n, _, _ in row_groups(profile) if least < end_ns and most >= lo)
    return rows + len(index.long_events)


def _events(
    profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int, columns: list[str],
    batch_size: int,
) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray]]:  # fmt: skip
    """The events overlapping the window as window() reads them (the long ones from the index,
    first, then the short ones by start), a batch at a time, with lane and depth (a streamed
    index's per-row ones when it has them: neither the lane columns nor the parents read)."""
    if len(index.row_lane):
        long, lane, depth = long_rows(index, start_ns, end_ns)
        drawn = [c for c in columns if c in DRAWN_COLUMNS]
        if long.num_rows:
            yield long.select(drawn), lane, depth
        yield from short_rows(profile, index, start_ns, end_ns, drawn, batch_size)
        return
    le = index.long_events
    overlap = pc.and_(
        pc.less(le.column("start_ns"), end_ns),
        pc.greater_equal(pc.add(le.column("start_ns"), le.column("dur_ns")), start_ns),
    )
    opened = OpenEvents()
    long = le.filter(overlap)
    lane = lane_of(long, index)
    long, lane = long.filter(pa.array(lane >= 0)), lane[lane >= 0]
    ids = long.column("id").to_numpy()
    depth = depths(ids, long.column("parent_id").fill_null(-1).to_numpy(), lane)
    opened.add(ids, depth, lane, np.full(len(ids), END_LIMIT, np.int64), pinned=True)
    if long.num_rows:
        yield long.select(columns), lane, depth
    short_filter = (
        (pc.field("start_ns") < end_ns)
        & (pc.field("start_ns") >= start_ns - max(index.long_threshold_ns, 0))
        & (pc.field("dur_ns") <= index.long_threshold_ns)
        & ((pc.field("start_ns") + pc.field("dur_ns")) >= start_ns)
    )
    for b in batches(profile, columns, short_filter, batch_size):
        t = pa.Table.from_batches([b])
        lane = lane_of(t, index)
        if not (lane >= 0).all():
            t, lane = t.filter(pa.array(lane >= 0)), lane[lane >= 0]
        start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
        parents = t.column("parent_id").fill_null(-1).to_numpy()
        depth = opened.depths(t.column("id").to_numpy(), parents, lane, start, _ends(start, dur))
        yield t, lane, depth


def reduce_batched(
    profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int, width_px: int,
    max_rects: int, con: Any = None, batch_size: int = BATCH_ROWS,
) -> tuple[int, float, pa.Table]:  # fmt: skip
    """(events in the window, the bucket width chosen, the rectangles as window()'s _reduce
    gives them) for a window of any size, in one pass, in memory bounded by a batch and the
    rectangles: the bucket doubles as soon as what is held proves it too narrow (more than
    `max_rects` rectangles already), the groups held merged into the wider buckets and the
    events held alone that are now narrower than a bucket merged with them."""
    import duckdb

    con = con if con is not None else duckdb.connect()
    ns_per_px = (end_ns - start_ns) / width_px
    per_cell = width_px * 2 + 4  # window()'s key: (lane * 128 + depth) * per_cell + bucket
    shift, events = 0, 0  # the bucket is 2^shift pixels wide
    wide: list[pa.Table] = []
    partial: list[pa.Table] = []
    held, alone, keys = 0, 0, np.zeros(0, np.int64)
    for t, lane, depth in _events(profile, index, start_ns, end_ns, WINDOW_COLUMNS, batch_size):
        events += t.num_rows
        start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
        # the pixel each starts in; a bucket 2^k pixels wide is that >> k, exactly: the division
        # by ns_per_px * 2^k is the one by ns_per_px scaled by 2^-k, rounding and all
        pixel = np.floor((np.maximum(start, start_ns) - start_ns) / ns_per_px).astype(np.int64)
        cell = lane.astype(np.int64) * 128 + np.minimum(depth, 127)
        small = dur < ns_per_px * (1 << shift)
        wide.append(_wide(t, lane, depth, np.flatnonzero(~small), cell * per_cell + pixel))
        part = _partial(t, lane, depth, np.flatnonzero(small), cell * per_cell + (pixel >> shift))
        partial.append(part)
        held += part.num_rows
        if held > COMPACT_ROWS:
            partial = [_merge(con, partial)]
            held = partial[0].num_rows
        keys = np.union1d(keys, part.column("k").to_numpy())  # the groups' distinct keys
        alone += wide[-1].num_rows
        while (1 << shift) <= width_px and alone + len(keys) > max_rects:
            shift += 1  # too narrow: every wider bucket is tried as window() tries them
            wide, partial = _widen(wide, partial, ns_per_px * (1 << shift), per_cell, shift)
            alone = wide[0].num_rows if wide else 0
            keys = np.unique(np.concatenate([keys // per_cell * per_cell + keys % per_cell // 2,
                                             partial[-1].column("k").to_numpy()]))  # fmt: skip
            partial = [_merge(con, partial)]
            held = partial[0].num_rows
    groups = _merge(con, partial) if partial else None
    con.register("_g", groups if groups is not None else _PARTIAL_SCHEMA.empty_table())
    wide_t = pa.concat_tables(wide).drop_columns(["k"]) if wide else _WIDE.empty_table()
    con.register("_w", wide_t)
    try:
        return (
            events,
            ns_per_px * (1 << shift),
            con.sql(
                "SELECT * FROM _w UNION ALL SELECT lane, depth, s, e - s, bid, n, "
                "CASE WHEN mn IS NOT NULL AND mn = mx THEN mn ELSE CAST(n AS VARCHAR) || ' events' "
                "END, bkind FROM _g ORDER BY 1, 2, 3, 5"
            ).to_arrow_table(),
        )
    finally:
        con.unregister("_g")
        con.unregister("_w")


def _widen(wide: list[pa.Table], partial: list[pa.Table], bucket_ns: float, per_cell: int,
           shift: int) -> tuple[list[pa.Table], list[pa.Table]]:  # fmt: skip
    """The events held alone and the groups, at a bucket twice as wide: the groups' keys
    halved, and the events narrower than it made groups of one."""
    out = []
    for p in partial:
        k = p.column("k").to_numpy()
        out.append(p.set_column(0, "k", pa.array(k // per_cell * per_cell + (k % per_cell) // 2)))
    w = pa.concat_tables(wide) if wide else _WIDE.append(pa.field("k", pa.int64())).empty_table()
    dur, k = w.column("dur_ns").to_numpy(), w.column("k").to_numpy()  # k: at one pixel
    narrow = dur < bucket_ns
    n = w.filter(pa.array(narrow))  # the last of `out`, even when empty: its keys are new
    key = k[narrow] // per_cell * per_cell + (k[narrow] % per_cell >> shift)
    start = n.column("start_ns").to_numpy()
    out.append(pa.table([
        pa.array(key, pa.int64()), n.column("lane"), n.column("depth"), n.column("start_ns"),
        pa.array(start + n.column("dur_ns").to_numpy(), pa.int64()), n.column("id"),
        n.column("kind"), n.column("dur_ns"), n.column("count"), n.column("name"), n.column("name"),
    ], schema=_PARTIAL_SCHEMA))  # fmt: skip
    return [w.filter(pa.array(~narrow))], out


def _merge(con: Any, parts: list[pa.Table]) -> pa.Table:
    """Partial groups of several batches as one (window()'s aggregates, merged)."""
    con.register("_p", pa.concat_tables(parts))
    try:
        return con.sql(_PARTIAL.format(src="_p")).to_arrow_table().cast(_PARTIAL_SCHEMA)
    finally:
        con.unregister("_p")


def _strings(col: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    return col.take(pa.array(rows, pa.int64())).cast(pa.string()).combine_chunks()


def _wide(t: pa.Table, lane: np.ndarray, depth: np.ndarray, rows: np.ndarray,
          key: np.ndarray) -> pa.Table:  # fmt: skip
    """The batch's events at least a bucket wide, each its own rectangle, with its key at one
    pixel (`k`, for a wider bucket later)."""
    take = pa.array(rows, pa.int64())
    return pa.table([pa.array(lane[rows], pa.int32()), pa.array(depth[rows], pa.int32()),
                     t.column("start_ns").take(take), t.column("dur_ns").take(take),
                     t.column("id").take(take), pa.array(np.ones(len(rows), np.int64)),
                     _strings(t.column("name"), rows), _strings(t.column("kind"), rows),
                     pa.array(key[rows], pa.int64())],
                    schema=_WIDE.append(pa.field("k", pa.int64())))  # fmt: skip


def _partial(
    t: pa.Table, lane: np.ndarray, depth: np.ndarray, rows: np.ndarray, key: np.ndarray
) -> pa.Table:
    """The batch's narrower events grouped by key, in numpy: min start, max end, the longest
    (then lowest id) event's id, kind and duration, the count, and two of the names (the same
    one only when the group has one name), which _merge and the final SELECT combine."""
    start, dur = t.column("start_ns").to_numpy()[rows], t.column("dur_ns").to_numpy()[rows]
    ids, k = t.column("id").to_numpy()[rows], key[rows]
    order = np.lexsort((ids, -dur, k))
    rows, k = rows[order], k[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    if not len(rows):
        return _PARTIAL_SCHEMA.empty_table()
    start, dur = start[order], dur[order]
    best = rows[first]
    codes, names = _name_codes(t.column("name"))  # one dictionary over every chunk
    values = names.cast(pa.string())
    # each group's least and greatest name as strings (the merge compares strings: a code's
    # order is not the names' order), as ranks among the sorted names
    by_name = pc.sort_indices(values).to_numpy()
    rank = np.empty(len(values) + 1, np.int64)
    rank[by_name] = np.arange(len(values))
    none = len(values)
    rank[none] = none  # the code -1 (no name) lands here
    code = rank[codes[rows]]
    low = np.minimum.reduceat(code, first)
    high = np.maximum.reduceat(np.where(code == none, -1, code), first)
    pick = np.r_[by_name, 0]  # rank -> code; the last slot, for no name, is masked
    return pa.table([
        pa.array(k[first]), pa.array(lane[best], pa.int32()), pa.array(depth[best], pa.int32()),
        pa.array(np.minimum.reduceat(start, first)),
        pa.array(np.maximum.reduceat(start + dur, first)),
        pa.array(ids[order][first]), _strings(t.column("kind"), best), pa.array(dur[first]),
        pa.array(np.diff(np.r_[first, len(rows)]).astype(np.int64)),
        values.take(pa.array(pick[low], pa.int64(), mask=low == none)),
        values.take(pa.array(pick[np.maximum(high, 0)], pa.int64(), mask=high < 0)),
    ], schema=_PARTIAL_SCHEMA)  # fmt: skip

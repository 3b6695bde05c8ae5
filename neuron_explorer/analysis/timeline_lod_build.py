"""The build of a timeline's level-of-detail pyramid (timeline_lod): one pass over the events in
record batches keeps per level the wide events as rows and the narrow ones merged into cells,
bounded by the bytes it may hold (the finest levels dropped past them).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from .search import _name_codes
from .timeline_index import (
    DRAWN_COLUMNS,
    END_LIMIT,
    WINDOW_COLUMNS,
    TimelineIndex,
    _ends,
    lane_of,
    short_rows,
)
from .timeline_lod import COMPACT_ROWS, LEVEL_SHIFTS, SCHEMA, Pyramid
from .timeline_stream import BATCH_ROWS, OpenEvents, batches


def default_buckets(index: TimelineIndex, shifts: tuple[int, ...] = LEVEL_SHIFTS) -> list[float]:
    extent = max(index.end_ns - index.start_ns, 1)
    return [extent / (1 << k) for k in shifts]


def build_pyramid(profile: Profile, index: TimelineIndex, buckets: list[float] | None = None,
                  batch_size: int = BATCH_ROWS, compact_rows: int = COMPACT_ROWS,
                  max_bytes: int | None = None) -> Pyramid:  # fmt: skip
    """The pyramid of `profile` (levels of `buckets` ns, finest first), in one pass over its
    events in batches: memory bounded by a batch and the rows kept, which `max_bytes` bounds
    (with the largest level's sorted copy: a level is sorted apart, beside the others) by
    dropping the finest levels left whenever they would pass it (their windows are then
    merged from a coarser level, or read as events)."""
    buckets = buckets or default_buckets(index)
    origin, thr = index.start_ns, index.long_threshold_ns
    opened = OpenEvents()
    live: list[_Level | None] = [_Level() for _ in buckets]  # None once dropped
    for t, lane, depth in _events(profile, index, opened, batch_size):
        start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
        ends = _ends(start, dur)
        codes, names = _name_codes(t.column("name"))
        # one sort a batch by (lane, depth, start): every level's cells are runs of it
        by_cell = np.lexsort((start, lane.astype(np.int64) * 128 + np.minimum(depth, 127)))
        for level, width in enumerate(buckets):
            lv = live[level]
            if lv is not None:
                lv.add(_level_rows(t, level, width, origin, thr, lane, depth, codes, names, ends,
                                   by_cell))  # fmt: skip
        if sum(lv.cells for lv in live if lv) > compact_rows:
            for level, lv in enumerate(live):
                if lv is not None:
                    # a lane's events come in start order (a file is in (rank, start) order):
                    # cells before this batch's first bucket get no more events
                    # (_merge_repeated makes sure)
                    lv.compact(int(np.floor((start.min() - origin) / buckets[level])))
        while max_bytes is not None and any(live) and _peak(live) > max_bytes:
            live[next(i for i, lv in enumerate(live) if lv)] = None  # the finest left
    levels = [i for i, lv in enumerate(live) if lv is not None]
    groups = []
    for new, level in enumerate(levels):  # one level at a time: the others stay as they are
        lv = live[level]
        assert lv is not None
        for take in (lv.take_wide, lv.take_cells):  # the unsorted rows let go before the next
            rows = take()
            if rows.num_rows:
                order = pc.sort_indices(rows, [("start_ns", "ascending"), ("id", "ascending")])
                rows = rows.take(order).combine_chunks()
                if new != level:  # finer levels dropped: this one is numbered `new`
                    rows = rows.set_column(0, "level", pa.array(np.full(rows.num_rows, new,
                                                                        np.int8)))  # fmt: skip
                groups.append(rows)
        live[level] = None
    rows = pa.concat_tables(groups) if groups else SCHEMA.empty_table()  # a chunk a group
    return Pyramid(origin, tuple(buckets[i] for i in levels), thr, rows)


def _events(profile: Profile, index: TimelineIndex, opened: OpenEvents,
            batch_size: int) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray]]:  # fmt: skip
    """Every event in stored order, a batch at a time, with its lane and depth: the index's
    per-row ones when it has them (neither the lane columns nor the parents read: the build
    of the 10 GB trace's pyramid spent a third of its time on them), else found here."""
    if len(index.row_lane):
        yield from short_rows(profile, index, -(1 << 62), END_LIMIT, DRAWN_COLUMNS, batch_size,
                              every=True)  # fmt: skip
        return
    for b in batches(profile, WINDOW_COLUMNS, batch_size=batch_size):
        t = pa.Table.from_batches([b])
        lane = lane_of(t, index).astype(np.int64)
        start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
        depth = opened.depths(t.column("id").to_numpy(), t.column("parent_id").fill_null(-1)
                              .to_numpy(), lane, start, _ends(start, dur))  # fmt: skip
        yield t, lane, depth


def _peak(live: list[_Level | None]) -> int:
    """What the build would hold at its end: every level's rows, and the largest sorted again."""
    held = [lv.nbytes for lv in live if lv is not None]
    return sum(held) + max(held, default=0)


class _Level:
    """The rows one level keeps while the pass goes on: its wide rows, the cells no later
    batch adds to, and the cells still open (partial, merged once COMPACT_ROWS pile up)."""

    def __init__(self) -> None:
        self.wide: list[pa.Table] = []
        self.closed: list[pa.Table] = []
        self.parts: list[pa.Table] = []
        self.cells = 0  # rows in parts
        self.nbytes = 0  # of every table kept

    def add(self, part: pa.Table) -> None:
        cell = part.column("cell").to_numpy(zero_copy_only=False)
        wide, cells = part.filter(pa.array(~cell)), part.filter(pa.array(cell))
        self.wide.append(wide)
        self.parts.append(cells)
        self.cells += cells.num_rows
        self.nbytes += wide.nbytes + cells.nbytes

    def compact(self, first_bucket: int) -> None:
        """Merge the open cells; those before `first_bucket` are closed."""
        if not self.parts:
            return
        merged = _merge(self.parts)
        done = merged.column("bucket").to_numpy() < first_bucket
        self.closed.append(merged.filter(pa.array(done)))
        self.parts = [merged.filter(pa.array(~done))]
        self.cells = self.parts[0].num_rows
        self.nbytes = sum(t.nbytes for t in (*self.wide, *self.closed, *self.parts))

    def take_wide(self) -> pa.Table:
        wide, self.wide = self.wide, []
        return pa.concat_tables(wide) if wide else SCHEMA.empty_table()

    def take_cells(self) -> pa.Table:
        closed, parts = self.closed, self.parts
        self.closed, self.parts = [], []
        cells = pa.concat_tables([*closed, _merge(parts) if parts else SCHEMA.empty_table()])
        return _merge_repeated(cells)


def _level_rows(t, level, width, origin, thr, lane, depth, codes, names, ends,
                by_cell) -> pa.Table:  # fmt: skip
    """One batch at one level: its wide events (width..thr long) and its cells, partial
    (`by_cell`: the rows in (lane, depth, start) order, where a level's cells are runs)."""
    start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
    ids = t.column("id").to_numpy()
    ok = lane >= 0
    wide = np.flatnonzero(ok & (dur >= width) & (dur <= thr))
    small = np.flatnonzero(ok & (dur < width))
    bucket = np.floor((start - origin) / width).astype(np.int64)
    key = (lane * 128 + np.minimum(depth, 127)) * (1 << 40) + bucket
    is_small = np.zeros(len(start), bool)
    is_small[small] = True
    order = by_cell[is_small[by_cell]]  # a bucket grows with start: keys in order, cells runs
    k = key[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if len(k) else np.zeros(0, np.int64)
    best = _longest(order, first, dur, ids)
    code = codes[order]
    one = (np.minimum.reduceat(code, first) == np.maximum.reduceat(code, first)) if len(k) else \
        np.zeros(0, bool)  # fmt: skip
    sel = np.concatenate([wide, best])
    n_wide = len(wide)
    name_col = names.cast(pa.string())
    name_codes = codes[sel]
    name_arr = name_col.take(pa.array(np.maximum(name_codes, 0), pa.int64(),
                                      mask=name_codes < 0))  # fmt: skip
    kind = t.column("kind").take(pa.array(sel, pa.int64())).cast(pa.string()).combine_chunks()
    counts = np.diff(np.r_[first, len(order)]).astype(np.int64) if len(k) else np.zeros(0, np.int64)
    cols = [
        np.full(len(sel), level, np.int8),
        np.r_[np.zeros(n_wide, bool), np.ones(len(best), bool)],
        lane[sel].astype(np.int32),
        depth[sel].astype(np.int32),
        bucket[sel],
        np.r_[start[wide], np.minimum.reduceat(start[order], first) if len(k) else []],
        np.r_[ends[wide], np.maximum.reduceat(ends[order], first) if len(k) else []],
        ids[sel],
        dur[sel],
        np.r_[np.ones(n_wide, np.int64), counts],
    ]
    arrays = [pa.array(np.asarray(c, dtype=f.type.to_pandas_dtype()), f.type)
              for c, f in zip(cols, SCHEMA, strict=False)]  # fmt: skip
    return pa.table([*arrays, name_arr, kind, pa.array(np.r_[np.ones(n_wide, bool), one])],
                    schema=SCHEMA)  # fmt: skip


def _longest(order: np.ndarray, first: np.ndarray, dur: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Each run's (of `order`, starting at `first`) longest row, the lowest id among ties."""
    if not len(order):
        return order
    run = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(order)]))
    d, i = dur[order], ids[order]
    tie = d == np.maximum.reduceat(d, first)[run]
    low = np.minimum.reduceat(np.where(tie, i, np.iinfo(np.int64).max), first)
    at = np.flatnonzero(tie & (i == low[run]))
    return order[at[np.r_[True, run[at][1:] != run[at][:-1]]]]  # the first, were ids repeated


def _merge_repeated(cells: pa.Table) -> pa.Table:
    """The cells with each key once: a key repeats only where a lane's events came out of start
    order (in another file), and only those are merged (merging all would double the peak)."""
    if not cells.num_rows:
        return cells
    level, lane = cells.column("level").to_numpy(), cells.column("lane").to_numpy()
    depth, bucket = cells.column("depth").to_numpy(), cells.column("bucket").to_numpy()
    nb, nl = int(bucket.max()) + 1, int(lane.max()) + 1
    key = ((level.astype(np.int64) * nl + lane) * 128 + np.minimum(depth, 127)) * nb + bucket
    order = np.argsort(key, kind="stable")
    same = key[order][1:] == key[order][:-1]
    if not same.any():
        return cells
    repeated = np.zeros(len(key), bool)
    repeated[order[1:][same]] = True
    repeated[order[:-1][same]] = True
    return pa.concat_tables([cells.filter(pa.array(~repeated)),
                             _merge([cells.filter(pa.array(repeated))])])  # fmt: skip


def _merge(parts: list[pa.Table]) -> pa.Table:
    """Partial cells of several batches as one (the same cell's counts summed, its longest
    event kept), in numpy: DuckDB's hash aggregate held a gigabyte more at 38 M events."""
    t = pa.concat_tables(parts).combine_chunks()
    if not t.num_rows:
        return t
    col = {c: t.column(c).to_numpy(zero_copy_only=False) for c in
           ("level", "lane", "depth", "bucket", "start_ns", "end_ns", "id", "bd", "count", "one")}  # fmt: skip
    nb, nl = int(col["bucket"].max()) + 1, int(col["lane"].max()) + 1
    key = ((col["level"].astype(np.int64) * nl + col["lane"]) * 128 + col["depth"]) * nb
    key += col["bucket"]
    order = np.lexsort((col["id"], -col["bd"], key))  # a cell's longest, then lowest id, first
    k = key[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    best = order[first]
    names = pc.dictionary_encode(t.column("name")).combine_chunks()
    code = names.indices.fill_null(-1).to_numpy(zero_copy_only=False)[order]
    one = np.minimum.reduceat(col["one"][order].astype(np.int8), first).astype(bool)
    one &= np.minimum.reduceat(code, first) == np.maximum.reduceat(code, first)
    out = t.take(pa.array(best, pa.int64()))
    for name, values in (("start_ns", np.minimum.reduceat(col["start_ns"][order], first)),
                         ("end_ns", np.maximum.reduceat(col["end_ns"][order], first)),
                         ("count", np.add.reduceat(col["count"][order], first)),
                         ("one", one)):  # fmt: skip
        out = out.set_column(out.schema.get_field_index(name), name, pa.array(values))
    return out.cast(SCHEMA)

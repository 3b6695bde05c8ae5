"""A level-of-detail pyramid of a profile too big to hold in memory: a wide timeline window is
answered from a few thousand pre-merged cells instead of its million events (issue 31).

Pattern: a window's rectangles merge events per (lane, depth, bucket of one pixel or more), so
cells merged per (lane, depth, bucket) at a fixed width no wider than a pixel merge again into
the same rectangles. Algorithm: one pass over the events in record batches (depth carried over
open events, as timeline_stream) keeps, per level of bucket width B, the events at least B wide
(up to the index's long threshold) as rows of their own and the narrower ones as cells (count,
min start, max end, the longest event, whether they share one name); a window takes the level
with B at most its ns per pixel and nearest it, the cells whose buckets lie inside it, the wide rows and
long events overlapping it, and reads the events of its two edge buckets, so every event in the
window is counted exactly once, then merges them as timeline.window merges events.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from ..vocab.intervals import depths
from .timeline_index import TimelineIndex, _ends, lane_of, lanes_and_depths

LEVEL_SHIFTS = (18, 16, 14, 12)  # bucket widths extent / 2^k, finest first (each 4x coarser)
LOD_EVENTS = 200_000  # windows over more events than this are answered from the pyramid
COMPACT_ROWS = 1 << 18  # partial cells merged once this many pile up
SCHEMA = pa.schema([("level", pa.int8()), ("cell", pa.bool_()), ("lane", pa.int32()),
                    ("depth", pa.int32()), ("bucket", pa.int64()), ("start_ns", pa.int64()),
                    ("end_ns", pa.int64()), ("id", pa.int64()), ("bd", pa.int64()),
                    ("count", pa.int64()), ("name", pa.string()), ("kind", pa.string()),
                    ("one", pa.bool_())])  # fmt: skip


@dataclass(frozen=True)
class Pyramid:
    """The levels' bucket widths (finest first) from `origin`, and their rows sorted by
    (level, cell, start_ns): a level's wide rows, then its cells."""

    origin: int
    buckets: tuple[float, ...]
    long_threshold_ns: int
    rows: pa.Table

    @cached_property
    def slices(self) -> dict[tuple[int, bool], tuple[int, int]]:
        """(level, cell) -> the [lo, hi) rows holding them (found once, for every window)."""
        lv = self.rows.column("level").to_numpy()
        cell = self.rows.column("cell").to_numpy(zero_copy_only=False)
        out = {}
        for level in range(len(self.buckets)):
            for c in (False, True):
                key = level * 2 + int(c)
                lo, hi = np.searchsorted(lv * 2 + cell, [key, key + 1])
                out[(level, c)] = (int(lo), int(hi))
        return out


def level_for(pyr: Pyramid, ns_per_px: float) -> int | None:
    """The level whose bucket is at most a pixel wide and nearest it (the fewest rows to read),
    None when there is none."""
    fits = [i for i, b in enumerate(pyr.buckets) if b <= ns_per_px]
    return min(fits, key=lambda i: ns_per_px - pyr.buckets[i]) if fits else None


def reduce_from_pyramid(
    profile: Profile, index: TimelineIndex, pyr: Pyramid, level: int, start_ns: int, end_ns: int,
    width_px: int, max_rects: int,
) -> tuple[int, float, pa.Table]:  # fmt: skip
    """(events in the window, the bucket width chosen, the rectangles as timeline.window's
    _reduce gives them) from the pyramid's `level`."""
    rows = pyramid_rows(profile, index, pyr, level, start_ns, end_ns)
    return _merge_window(rows, start_ns, end_ns, width_px, max_rects)


def pyramid_rows(profile: Profile, index: TimelineIndex, pyr: Pyramid, level: int,
                 start_ns: int, end_ns: int) -> pa.Table:  # fmt: skip
    """What a window merges from the pyramid's `level`: the cells of the buckets inside it, the
    wide rows and long events overlapping it, and the events of its two edge buckets."""
    width, origin, thr = pyr.buckets[level], pyr.origin, pyr.long_threshold_ns
    b_lo = int(np.ceil((start_ns - origin) / width))
    b_hi = max(int(np.floor((end_ns - origin) / width)), b_lo)  # the buckets inside it
    sl = pyr.slices
    parts = [_rows_between(pyr, sl[(level, True)], b_lo, b_hi, "bucket")]
    wide = _rows_between(pyr, sl[(level, False)], start_ns - max(thr, 0), end_ns, "start_ns")
    parts.append(wide.filter(pc.greater_equal(wide.column("end_ns"), start_ns)))
    parts.append(_long_rows(index, width, start_ns, end_ns))
    # the edges: events narrower than a bucket in the window's buckets not wholly inside it
    inner_lo = int(min(max(np.ceil(origin + b_lo * width), start_ns + 1), end_ns))
    parts.append(_edge_rows(profile, index, pyr, level, start_ns, inner_lo, b_lo, b_hi))
    inner_hi = int(max(origin + b_hi * width - 1, start_ns))
    if inner_hi < end_ns:
        parts.append(_edge_rows(profile, index, pyr, level, inner_hi, end_ns, b_lo, b_hi))
    return pa.concat_tables([p.select(_ROW_COLUMNS).cast(_ROWS) for p in parts])


_ROW_COLUMNS = ["lane", "depth", "start_ns", "end_ns", "id", "bd", "count", "name", "kind", "one"]
_ROWS = pa.schema([SCHEMA.field(c) for c in _ROW_COLUMNS])


def _rows_between(pyr: Pyramid, sl: tuple[int, int], lo: float, hi: float, col: str) -> pa.Table:
    """The rows of one slice whose `col` is in [lo, hi) (the slice is sorted by it)."""
    part = pyr.rows.slice(sl[0], sl[1] - sl[0])
    values = part.column(col).to_numpy()
    a, b = np.searchsorted(values, [np.ceil(lo), np.ceil(hi)])
    return part.slice(int(a), int(b - a))


def _as_rows(t: pa.Table, lane: np.ndarray, depth: np.ndarray) -> pa.Table:
    """Events as pyramid rows of one event each."""
    start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
    return pa.table([
        pa.array(lane, pa.int32()), pa.array(depth, pa.int32()), pa.array(start),
        pa.array(_ends(start, dur)), t.column("id").combine_chunks().cast(pa.int64()),
        pa.array(dur), pa.array(np.ones(len(start), np.int64)),
        t.column("name").cast(pa.string()).combine_chunks(),
        t.column("kind").cast(pa.string()).combine_chunks(),
        pa.array(np.ones(len(start), bool)),
    ], schema=_ROWS)  # fmt: skip


def _long_rows(index: TimelineIndex, width: float, start_ns: int, end_ns: int) -> pa.Table:
    """The index's long events (over its threshold, so not in the pyramid's wide rows) that
    overlap the window and are at least a level bucket wide; the narrower are in its cells."""
    le = index.long_events
    start, dur = le.column("start_ns").to_numpy(), le.column("dur_ns").to_numpy()
    lane, depth = _long_lanes(index)
    keep = np.flatnonzero((start < end_ns) & (_ends(start, dur) >= start_ns) & (dur >= width)
                          & (lane >= 0))  # fmt: skip
    return _as_rows(le.take(pa.array(keep, pa.int64())), lane[keep], depth[keep])


# id(long events) -> (a weak reference to them, their lanes, their depths): the same for every
# window of an index (20,000 events: a few ms a window)
_LONG: dict[int, tuple[weakref.ref[pa.Table], np.ndarray, np.ndarray]] = {}


def _long_lanes(index: TimelineIndex) -> tuple[np.ndarray, np.ndarray]:
    """The lane and nesting depth of each of the index's long events, found once per index."""
    le = index.long_events
    hit = _LONG.get(id(le))
    if hit is None or hit[0]() is not le:
        lane = lane_of(le, index).astype(np.int64)
        # a long event's ancestors are longer still, so all of them are long events too
        depth = depths(le.column("id").to_numpy(), le.column("parent_id").fill_null(-1).to_numpy(),
                       lane)  # fmt: skip
        if len(_LONG) >= 16:  # indices let go of: their entries are dead
            _LONG.clear()
        hit = _LONG[id(le)] = (weakref.ref(le), lane, depth)
    return hit[1], hit[2]


def _edge_rows(profile: Profile, index: TimelineIndex, pyr: Pyramid, level: int, lo: int,
               hi: int, b_lo: int, b_hi: int) -> pa.Table:  # fmt: skip
    """The events overlapping [lo, hi) narrower than a level bucket whose bucket is outside
    [b_lo, b_hi) (the cells hold those inside): a window's edges, read as events."""
    if hi <= lo:
        return _ROWS.empty_table()
    width = pyr.buckets[level]
    t, lane, depth = lanes_and_depths(profile, index, lo, hi)
    start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
    bucket = np.floor((start - pyr.origin) / width).astype(np.int64)  # as build_pyramid
    rows = np.flatnonzero((dur < width) & ((bucket < b_lo) | (bucket >= b_hi)))
    return _as_rows(t.take(pa.array(rows, pa.int64())), lane[rows], depth[rows])


def _merge_window(rows: pa.Table, start_ns: int, end_ns: int, width_px: int,
                  max_rects: int) -> tuple[int, float, pa.Table]:  # fmt: skip
    """The rows merged as timeline.window merges events: rows at least a window bucket wide
    alone, the others per (lane, depth, bucket), the bucket doubled until they fit. In numpy:
    a window's few thousand groups cost DuckDB's planning and Arrow hand-over more than the
    grouping (15 ms of a 75 ms window on a 10 GB trace's profile)."""
    start, bd = rows.column("start_ns").to_numpy(), rows.column("bd").to_numpy()
    lane, depth = rows.column("lane").to_numpy(), rows.column("depth").to_numpy()
    count = rows.column("count").to_numpy()
    ns_per_px = (end_ns - start_ns) / width_px
    factor = 1.0
    while True:
        bucket_ns = ns_per_px * factor
        small = (bd < bucket_ns) | (count > 1)
        bucket = np.floor((np.maximum(start, start_ns) - start_ns) / bucket_ns).astype(np.int64)
        key = (lane.astype(np.int64) * 128 + np.minimum(depth, 127)) * (width_px * 2 + 4) + bucket
        n_groups = len(np.unique(key[small])) + int((~small).sum())
        if n_groups <= max_rects or factor > width_px:
            break
        factor *= 2
    return int(count.sum()), bucket_ns, _groups(rows, small, key)


def _groups(rows: pa.Table, small: np.ndarray, key: np.ndarray) -> pa.Table:
    """The rectangles: each row not `small` alone, the small ones merged per key (the span of
    their starts and ends, their counts summed, the longest then lowest id naming the kind, the
    name kept only when every row is of that one name), in (lane, depth, start, id) order."""
    col = {c: rows.column(c).to_numpy(zero_copy_only=False) for c in
           ("lane", "depth", "start_ns", "end_ns", "id", "bd", "count", "one")}  # fmt: skip
    names = pc.dictionary_encode(rows.column("name")).combine_chunks()
    code = names.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    wide, sm = np.flatnonzero(~small), np.flatnonzero(small)
    order = sm[np.lexsort((col["id"][sm], -col["bd"][sm], key[sm]))]
    k = key[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if len(k) else np.zeros(0, np.int64)

    def per_group(ufunc: Any, values: np.ndarray) -> np.ndarray:
        return ufunc.reduceat(values[order], first) if len(k) else values[:0]

    best = order[first]
    low, high = per_group(np.minimum, code), per_group(np.maximum, code)
    one = per_group(np.minimum, col["one"].astype(np.int8)).astype(bool)
    total = per_group(np.add, col["count"])
    g_start = per_group(np.minimum, col["start_ns"])
    pick = np.r_[wide, best]
    start = np.r_[col["start_ns"][wide], g_start]
    dur = np.r_[
        col["end_ns"][wide] - col["start_ns"][wide], per_group(np.maximum, col["end_ns"]) - g_start
    ]
    ids = col["id"][pick]
    lane, depth = col["lane"][pick], col["depth"][pick]
    sort = np.lexsort((ids, start, depth, lane))
    values = names.dictionary.to_pylist()
    kept = one & (low == high) & (low >= 0)  # one name, no nulls: the group keeps it
    named = np.r_[code[wide], np.where(kept, low, -1)][sort]
    counts = np.r_[np.ones(len(wide), np.int64), total][sort]
    label = [values[c] if c >= 0 else None for c in named.tolist()]
    for i in np.flatnonzero(np.r_[np.zeros(len(wide), bool), ~kept][sort]).tolist():
        label[i] = f"{counts[i]} events"
    kind = rows.column("kind").take(pa.array(pick[sort], pa.int64()))
    return pa.table({"lane": pa.array(lane[sort], pa.int32()),
                     "depth": pa.array(depth[sort], pa.int32()), "start_ns": start[sort],
                     "dur_ns": dur[sort], "id": ids[sort], "count": counts,
                     "name": pa.array(label, pa.string()), "kind": kind})  # fmt: skip


def pyramid_parts(pyr: Pyramid) -> tuple[dict[str, Any], pa.Table]:
    """The pyramid as the disk cache keeps it: its scalars (JSON) and its rows (Arrow)."""
    meta = {"origin": pyr.origin, "buckets": list(pyr.buckets),
            "long_threshold_ns": pyr.long_threshold_ns}  # fmt: skip
    return meta, pyr.rows


def pyramid_from_parts(meta: dict[str, Any], rows: pa.Table) -> Pyramid:
    return Pyramid(meta["origin"], tuple(meta["buckets"]), meta["long_threshold_ns"],
                   rows.cast(SCHEMA))  # fmt: skip

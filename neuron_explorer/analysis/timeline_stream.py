"""The timeline index of a profile too big to hold in memory, built from its events in record
batches: the same TimelineIndex as timeline_index.build_index, without the per-event arrays.

Pattern: events are stored in (rank, start_ns) order and a parent starts before its children,
so one forward pass sees every parent before its children. Algorithm: lanes are keyed by value
(each row group has its own dictionary codes); nesting depth carries, across batches, the events
still open (their end not yet passed); the longest events are a running top-k; where the events
are (`fit`) is a running largest gap over the events merged across ranks in start order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ..model.profile import Profile
from ..vocab.intervals import _parent_rows
from .event_groups import group_tables, readable
from .search_stream import NameCounter
from .timeline_index import (
    END_LIMIT,
    LONG_EVENTS,
    STRAY_SHARE,
    STRAY_STRETCH,
    WINDOW_COLUMNS,
    TimelineIndex,
    _ends,
    _lane_sort_key,
    lane_rows,
)  # fmt: skip

BATCH_ROWS = 1 << 18  # rows a batch holds at most (a batch never spans row groups)
DEPTH_LIMIT = 64  # as vocab.intervals.depths: deeper nesting counts as 64


def batches(profile: Profile, columns: list[str], filter: Any = None,
            batch_size: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The events' `columns` in stored order ((rank, start_ns) in each file), a batch at a time:
    a row group at a time (those whose statistics `filter` leaves), not through one scan of
    the dataset, whose read-ahead buffered far more than a batch (the 10 GB trace's profile:
    the streamed index peaked at 1.6 GB read by one scan, at 0.5 GB a row group at a time).
    Without a filter the groups are read with the footers kept (event_groups.group_tables:
    5.4 against 8.4 ms of CPU a group measured alone, 583 groups a pass on the 10 GB trace's
    profile; the index's whole pass: 13.5 against 13.7 s). A filter is left to the scan: it prunes groups by their statistics before it evaluates
    anything (an event at 9e18 ns would overflow `start_ns + dur_ns` in a group it prunes)."""
    if filter is None and readable(profile, columns):
        for t in group_tables(profile, columns):
            for b in t.to_batches(batch_size):
                if b.num_rows:
                    yield b
        return
    for fragment in profile.dataset("events").get_fragments(filter=filter):
        for group in fragment.split_by_row_group(filter):
            scan = group.to_batches(columns=columns, filter=filter, batch_size=batch_size,
                                    batch_readahead=0, fragment_readahead=0)  # fmt: skip
            for b in scan:
                if b.num_rows:
                    yield b


class OpenEvents:
    """Nesting depth streamed: what vocab.intervals.depths gives over all the rows passed to
    `depths` in turn (an event's parent counts when it was passed before, on the same lane), as
    long as a parent's end is not before its child's start (true of every nested event)."""

    def __init__(self) -> None:
        self.ids = np.zeros(0, np.int64)  # sorted
        self.depth = np.zeros(0, np.int32)
        self.lane = np.zeros(0, np.int64)
        self.end = np.zeros(0, np.int64)
        self.pinned = np.zeros(0, bool)  # never let go (a window's long events)

    def depths(self, ids, parents, lanes, start, end) -> np.ndarray:
        """The depth of each of these rows (in stored order, after every row passed before)."""
        n = len(ids)
        if n == 0:
            return np.zeros(0, np.int32)
        self._let_go(int(start.min()))
        pidx = _parent_rows(ids, parents)
        pidx = np.where((pidx >= 0) & (lanes[np.maximum(pidx, 0)] == lanes), pidx, -1)
        depth = np.zeros(n, np.int32)
        top = np.arange(n)  # the furthest ancestor found among these rows
        active = np.flatnonzero(pidx >= 0)
        cur = pidx[active]
        for _ in range(DEPTH_LIMIT):
            if not len(active):
                break
            depth[active] += 1
            top[active] = cur
            cur = pidx[cur]
            keep = cur >= 0
            active, cur = active[keep], cur[keep]
        # the top ancestor's parent, when it is an open event of an earlier batch on its lane
        m = len(self.ids)
        if m:
            tp = parents[top]
            at = np.searchsorted(self.ids, tp)
            found = (at < m) & (self.ids[np.minimum(at, m - 1)] == tp) & (pidx[top] < 0)
            found &= self.lane[np.minimum(at, m - 1)] == lanes[top]
            extra = np.where(found, self.depth[np.minimum(at, m - 1)] + 1, 0)
            depth = np.minimum(depth + extra, DEPTH_LIMIT).astype(np.int32)
        # what ends before the last row starts parents nothing after it: rows to come start
        # later on its rank, and other ranks' rows are on other lanes
        still = end >= start[-1]
        self.add(ids[still], depth[still], lanes[still], end[still])
        return depth

    def _let_go(self, start: int) -> None:
        keep = (self.end >= start) | self.pinned
        if not keep.all():
            self.ids, self.depth, self.lane = self.ids[keep], self.depth[keep], self.lane[keep]
            self.end, self.pinned = self.end[keep], self.pinned[keep]

    def add(self, ids, depth, lanes, end, pinned: bool = False) -> None:
        """Carry these rows (depth known) as open events; `pinned`: until the end."""
        ids = np.concatenate([self.ids, ids])
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        self.depth = np.concatenate([self.depth, depth])[order]
        self.lane = np.concatenate([self.lane, lanes.astype(np.int64)])[order]
        self.end = np.concatenate([self.end, end])[order]
        self.pinned = np.concatenate([self.pinned, np.full(len(depth), pinned)])[order]


class LongestEvents:
    """A running top-k by duration: the rows longer than the (k+1)-th longest seen, as
    build_index keeps them (all rows while k or fewer are seen), in stored order."""

    def __init__(self, k: int = LONG_EVENTS) -> None:
        self.k = k
        self.seen = 0
        self.threshold = -1  # the (k+1)-th longest duration seen (-1 while k or fewer)
        self.ties = 0  # rows of exactly `threshold` seen (kept as a count, not as rows)
        self.parts: list[pa.RecordBatch] = []  # in stored order

    def add(self, batch: pa.RecordBatch) -> None:
        dur = batch.column("dur_ns").to_numpy()
        self.seen += len(dur)
        kept = np.concatenate([p.column("dur_ns").to_numpy() for p in self.parts] or [dur[:0]])
        if self.seen > self.k:
            pool = np.concatenate([kept, np.full(min(self.ties, self.k + 1), self.threshold),
                                   dur])  # fmt: skip
            self.threshold = int(np.partition(pool, len(pool) - 1 - self.k)[len(pool) - 1 - self.k])
            self.ties = int((pool == self.threshold).sum())
        keep = [p.column("dur_ns").to_numpy() > self.threshold for p in self.parts]
        self.parts = [p.filter(pa.array(k)) for p, k in zip(self.parts, keep, strict=True)]
        take = dur > self.threshold
        if take.any():
            self.parts.append(_plain(batch.filter(pa.array(take))))
        if len(self.parts) > 8:  # one part, not one a batch (a 10 GB trace has ~1,000)
            self.parts = pa.Table.from_batches(self.parts).combine_chunks().to_batches()

    def table(self, schema: pa.Schema) -> pa.Table:
        if not self.parts:
            return schema.empty_table()
        # one chunk, so one dictionary a column (an Arrow IPC file, the disk cache, needs it)
        return pa.Table.from_batches(self.parts).combine_chunks().cast(schema)


def _plain(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its dictionary columns decoded: each row group has its own dictionary,
    and kept rows of many are combined into one part."""
    cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
            for c in batch.columns]  # fmt: skip
    return pa.RecordBatch.from_arrays(cols, names=batch.schema.names)


class LargestGap:
    """timeline_index._fit streamed: events fed in start order (floats, as there)."""

    def __init__(self) -> None:
        self.n = 0
        self.first = 0.0
        self.reach = -np.inf
        self.best = (-np.inf, 0, 0.0, 0.0)  # gap, rows before it, reach before, start after

    def add(self, st: np.ndarray, en: np.ndarray) -> None:
        if not len(st):
            return
        if self.n == 0:
            self.first = float(st[0])
        reach = np.maximum.accumulate(np.maximum(en, self.reach))
        prev = np.concatenate([[self.reach], reach[:-1]])
        gaps = st - prev
        if self.n == 0:
            gaps[0] = -np.inf  # no gap before the first event
        i = int(np.argmax(gaps))
        if gaps[i] > self.best[0]:
            self.best = (float(gaps[i]), self.n + i, float(prev[i]), float(st[i]))
        self.n += len(st)
        self.reach = float(reach[-1])

    def fit(self) -> tuple[int, int, int] | None:
        n = self.n
        if n < 3:
            return None
        gap, before, reach_i, st_next = self.best
        after = n - before
        few = max(2, int(n * STRAY_SHARE))
        if after <= few and gap > STRAY_STRETCH * max(reach_i - self.first, 1):
            lo, hi, outside = self.first, reach_i, after
        elif before <= few and gap > STRAY_STRETCH * max(self.reach - st_next, 1):
            lo, hi, outside = st_next, self.reach, before
        else:
            return None
        pad = (hi - lo) / 20
        return (int(max(lo - pad, self.first)), int(min(hi + pad, self.reach)) + 1, int(outside))


def build_index_streamed(profile: Profile, batch_size: int = BATCH_ROWS, rows: bool = True,
                         names: NameCounter | None = None) -> TimelineIndex:  # fmt: skip
    """timeline_index.build_index in batches of `batch_size` rows: memory bounded by a batch
    and what is carried (open events, the longest events), not by the profile, and with
    `rows`, each row's lane and depth (3 bytes an event: TimelineIndex.row_lane, row_depth);
    `names` counts the names it reads (search_stream.name_counts, without a pass of its own)."""
    n_rows = profile.row_count("events") if rows and readable(profile, WINDOW_COLUMNS) else 0
    row_lane, row_depth, at = np.empty(n_rows, np.int16), np.empty(n_rows, np.int8), 0
    combos: dict[tuple[Any, ...], int] = {}
    counts = np.zeros(0, np.int64)
    deepest = np.zeros(0, np.int32)
    opened, longest, gap = OpenEvents(), LongestEvents(), LargestGap()
    in_order, last = True, None
    first: int | None = None
    end = -1
    for b in batches(profile, WINDOW_COLUMNS, batch_size=batch_size):
        t = pa.Table.from_batches([b])
        codes, found = lane_rows(t)
        lane = np.array([combos.setdefault(c, len(combos)) for c in found], np.int64)[codes]
        start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
        ends = _ends(start, dur)
        ids = t.column("id").to_numpy()
        depth = opened.depths(
            ids, t.column("parent_id").fill_null(-1).to_numpy(), lane, start, ends
        )
        if n_rows and (at + len(lane) > n_rows or len(combos) >= 2**15 or t.column(
                "start_ns").null_count or t.column("dur_ns").null_count):  # fmt: skip
            n_rows = 0  # rows not as counted, too many lanes or a null: windows read lanes
        if n_rows:
            row_lane[at : at + len(lane)], row_depth[at : at + len(lane)] = lane, depth
            at += len(lane)
        counts = _grown(counts, len(combos)) + np.bincount(lane, minlength=len(combos))
        deepest = _grown(deepest, len(combos))
        np.maximum.at(deepest, lane, depth)
        longest.add(b)
        if names is not None:
            names.add(t.column("name"))
        lo, hi = int(start.min()), int(ends.max())
        first, end = lo if first is None else min(first, lo), max(end, hi)
        in_order = (
            in_order and (last is None or lo >= last) and bool(np.all(start[1:] >= start[:-1]))
        )
        last = int(start[-1])
        if in_order:
            st = start.astype(np.float64)
            gap.add(st, st + dur.astype(np.float64))
    if not in_order:  # several ranks: their events merged in start order
        gap = _merged_gap(profile, sorted({c[0] for c in combos}), batch_size)
    order = _lane_order(list(combos))
    lanes = _lanes_table(list(combos), order, counts, deepest)
    extent_end = min(end + 1, END_LIMIT) if first is not None else 1
    if n_rows and at == n_rows:
        _renumber_lanes(row_lane, order)
    else:
        row_lane, row_depth = row_lane[:0], row_depth[:0]
    schema = profile.dataset("events").schema
    longest_rows = longest.table(pa.schema([schema.field(c) for c in WINDOW_COLUMNS]))
    return TimelineIndex(lanes, longest.threshold, longest_rows, first or 0, extent_end,
                         _steps(profile), gap.fit(), row_lane=row_lane, row_depth=row_depth)  # fmt: skip


def _steps(profile: Profile) -> tuple[dict[str, int], ...]:
    return tuple(
        {"step": s.step, "rank": s.rank, "start_ns": s.start_ns, "dur_ns": s.dur_ns}
        for s in profile.manifest.steps
    )


def _lanes_table(keys: list[tuple[Any, ...]], order: list[int], counts: np.ndarray,
                 deepest: np.ndarray) -> pa.Table:  # fmt: skip
    """The index's lanes in their drawing order: each lane's key, events and depth."""
    return pa.table({
        "rank": pa.array([keys[i][0] for i in order], pa.int32()),
        "layer": pa.array([keys[i][1] for i in order], pa.string()),
        "device": pa.array([keys[i][2] for i in order], pa.string()),
        "track": pa.array([keys[i][3] for i in order], pa.string()),
        "lane": pa.array(range(len(keys)), pa.int32()),
        "events": pa.array(counts[order] if len(keys) else [], pa.int64()),
        "depth": pa.array(deepest[order] + 1 if len(keys) else [], pa.int32()),
    })  # fmt: skip


def _renumber_lanes(row_lane: np.ndarray, order: list[int]) -> None:
    """The rows' lanes (numbered as first met) renumbered in drawing order, in place a slice at
    a time so no second array of the profile's rows is held."""
    lane_at = np.empty(max(len(order), 1), np.int16)
    lane_at[order] = np.arange(len(order), dtype=np.int16)
    for i in range(0, len(row_lane), 1 << 22):
        row_lane[i : i + (1 << 22)] = lane_at[row_lane[i : i + (1 << 22)]]


def _lane_order(keys: list[tuple[Any, ...]]) -> list[int]:
    return sorted(range(len(keys)), key=lambda i: _lane_sort_key(keys[i]))


def _grown(a: np.ndarray, n: int) -> np.ndarray:
    return a if len(a) >= n else np.concatenate([a, np.zeros(n - len(a), a.dtype)])


def _merged_gap(profile: Profile, ranks: list[int], batch_size: int) -> LargestGap:
    """LargestGap over every rank's events merged in start order (a rank's are in order in
    its file): each round takes, from every rank's batch, the events up to the earliest of
    their last starts, so nothing later can come before them."""
    import pyarrow.compute as pc

    size = max(4096, batch_size // max(1, len(ranks)))
    feeds = {r: batches(profile, ["start_ns", "dur_ns"], pc.field("rank") == r, size)
             for r in ranks}  # fmt: skip
    held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    gap = LargestGap()
    while True:
        for r in list(feeds):
            if r not in held or not len(held[r][0]):
                b = next(feeds[r], None)
                if b is None:
                    del feeds[r]
                    held.pop(r, None)
                    continue
                st = b.column("start_ns").to_numpy().astype(np.float64)
                held[r] = (st, st + b.column("dur_ns").to_numpy().astype(np.float64))
        if not held:
            return gap
        frontier = min(st[-1] for st, _ in held.values())
        parts = []
        for r in sorted(held):
            st, en = held[r]
            k = int(np.searchsorted(st, frontier, side="right"))
            parts.append((st[:k], en[:k]))
            held[r] = (st[k:], en[k:])
        st = np.concatenate([p[0] for p in parts])
        en = np.concatenate([p[1] for p in parts])
        o = np.argsort(st, kind="stable")
        gap.add(st[o], en[o])

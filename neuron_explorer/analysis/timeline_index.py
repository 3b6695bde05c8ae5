"""What every timeline window of one profile shares: its lanes (one per host thread and device
track, in the vocabulary's order) with their nesting depth, its extent, its longest events and
where its events are when a few strays lie far from the rest.

Pattern: the lanes are the distinct (rank, layer, device, track) of the events. Algorithm: the
three string columns are read as their Parquet dictionaries' codes, so a lane is a small integer
computed per row in numpy (no join, no GROUP BY over the strings), and one pass over the
columns gives each lane's count, extent and depth.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from ..vocab.engines import lane_order
from ..vocab.intervals import depths  # deeper nesting than 64 draws at 64
from .event_groups import group_tables_at, read_starting

LONG_EVENTS = 20_000  # the longest events, kept in memory for every window
WINDOW_COLUMNS = ["id", "parent_id", "rank", "layer", "device", "track", "start_ns", "dur_ns",
                  "name", "kind"]  # fmt: skip
DRAWN_COLUMNS = ["id", "start_ns", "dur_ns", "name", "kind"]  # what a window's rectangles read
LANE_COLUMNS = ("layer", "device", "track")  # with rank, what makes a lane
END_LIMIT = 2**63 - 1  # event ends are clamped here: int64, whatever a malformed event says
# the whole view fits the events when strays (a share of at most STRAY_SHARE, or two events,
# at either end) stretch the extent to more than STRAY_STRETCH times the span of the rest
STRAY_SHARE = 0.001
STRAY_STRETCH = 3
_DENSE_CODES = 1 << 24  # lane keys up to this many combinations are looked up in one array


@dataclass(frozen=True)
class TimelineIndex:
    """What every window of one profile shares: lanes, extent, the long events."""

    lanes: pa.Table  # rank, layer, device, track, lane, events, depth
    long_threshold_ns: int
    long_events: pa.Table
    start_ns: int
    end_ns: int
    steps: tuple[dict[str, int], ...]
    fit: tuple[int, int, int] | None = None  # (start, end, events outside) when strays stretch it
    # each event's lane and nesting depth, in the table's row order: a window over the whole
    # extent holds every event and its parents, so it reads neither the lane columns nor parents
    event_lane: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.int16), compare=False, repr=False
    )
    event_depth: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.int8), compare=False, repr=False
    )
    # a streamed index's (no per-event arrays) lane and depth of each row in stored order
    # (event_groups.row_groups' order), found by its one pass: a window reads them by position
    # instead of the lane columns and the parents (whose depths cost half a window's time)
    row_lane: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.int16), compare=False, repr=False
    )
    row_depth: np.ndarray = field(
        default_factory=lambda: np.zeros(0, np.int8), compare=False, repr=False
    )

    def lane_keys(self) -> dict[tuple[Any, ...], int]:
        """(rank, layer, device, track) -> lane."""
        cols = [self.lanes.column(c).to_pylist() for c in ("rank", *LANE_COLUMNS, "lane")]
        return {tuple(row[:4]): row[4] for row in zip(*cols, strict=True)}


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str | None]]:
    """Per row, a code into the returned values (the column's dictionary; its last entry None
    stands for the nulls)."""
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = col.unify_dictionaries()
    if not col.chunks:
        return np.zeros(0, dtype=np.int64), [None]
    values = col.chunks[0].dictionary.to_pylist() + [None]
    codes = [
        c.indices.fill_null(len(values) - 1).to_numpy(zero_copy_only=False) for c in col.chunks
    ]
    return np.concatenate(codes), values


def lane_rows(t: pa.Table) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """Per row of `t` (columns rank, layer, device, track), a code into the returned list of
    distinct (rank, layer, device, track), in no particular order."""
    rank = t.column("rank").to_numpy()
    if len(rank) == 0:
        return np.zeros(0, dtype=np.int64), []
    r0 = int(rank.min())
    parts: list[tuple[np.ndarray, list[Any]]] = [(rank - r0, list(range(r0, int(rank.max()) + 1)))]
    parts += [_codes(t.column(c)) for c in LANE_COLUMNS]
    size = int(np.prod([len(values) for _, values in parts], dtype=np.float64))
    wide = np.int64 if size >= 2**31 else np.int32  # int32 when the keys fit: half the memory
    key = parts[0][0].astype(wide)
    for codes, values in parts[1:]:
        key = key * len(values) + codes.astype(wide, copy=False)
    if size <= _DENSE_CODES:  # a dense look-up, O(rows); else a sort
        present = np.flatnonzero(np.bincount(key, minlength=size))
        inverse = np.full(size, -1, dtype=np.int32)
        inverse[present] = np.arange(len(present), dtype=np.int32)
        row_code = inverse[key]
    else:
        present, row_code = np.unique(key, return_inverse=True)
    combos = []
    for k in present.tolist():
        fields = []
        for _, values in reversed(parts):
            k, i = divmod(k, len(values))
            fields.append(values[i])
        combos.append(tuple(reversed(fields)))
    return row_code, combos


def _lane_sort_key(key: tuple[Any, ...]) -> tuple:
    """Host lanes first, then each device's lanes in the vocabulary's order (vocab/engines.py)."""
    rank, layer, device, track = key
    track = track or ""
    host = layer == "host"
    order = (0, 0, (len(track), track)) if host else lane_order(track)
    return (rank, not host, device or "", order)


def lane_of(t: pa.Table, index: TimelineIndex) -> np.ndarray:
    """The index's lane of each row of `t` (-1 for a lane it does not know)."""
    codes, combos = lane_rows(t)
    keys = index.lane_keys()
    lut = np.array([keys.get(c, -1) for c in combos] + [-1], dtype=np.int32)
    return lut[codes]


def _ends(start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """start + dur, clamped at END_LIMIT (a malformed event near int64's limit must not wrap)."""
    room = END_LIMIT - np.maximum(start, 0)
    return np.where(dur > room, END_LIMIT, start + np.minimum(dur, room))


def build_index(profile: Profile) -> TimelineIndex:
    """Lanes with their nesting depth, the profile's extent and its longest events."""
    ev = profile.table("events", columns=WINDOW_COLUMNS)
    codes, combos = lane_rows(ev)
    order = sorted(range(len(combos)), key=lambda i: _lane_sort_key(combos[i]))
    lane_at = np.empty(len(combos), dtype=np.int32)
    lane_at[order] = np.arange(len(combos), dtype=np.int32)
    lane = lane_at[codes] if len(codes) else np.zeros(0, dtype=np.int32)
    start, dur = ev.column("start_ns").to_numpy(), ev.column("dur_ns").to_numpy()
    n_lanes = len(combos)
    ids = ev.column("id").to_numpy()
    parents = ev.column("parent_id").fill_null(-1).to_numpy()
    depth = depths(ids, parents, lane)
    max_depth = np.zeros(n_lanes, dtype=np.int32)
    np.maximum.at(max_depth, lane, depth)
    lanes = pa.table({
        "rank": pa.array([combos[i][0] for i in order], pa.int32()),
        "layer": pa.array([combos[i][1] for i in order], pa.string()),
        "device": pa.array([combos[i][2] for i in order], pa.string()),
        "track": pa.array([combos[i][3] for i in order], pa.string()),
        "lane": pa.array(range(n_lanes), pa.int32()),
        "events": pa.array(np.bincount(lane, minlength=n_lanes), pa.int64()),
        "depth": pa.array(max_depth + 1, pa.int32()),
    })  # fmt: skip
    n = len(dur)
    # the (LONG_EVENTS + 1)-th longest duration: the events longer than it are kept
    threshold = (
        int(np.partition(dur, n - 1 - LONG_EVENTS)[n - 1 - LONG_EVENTS]) if n > LONG_EVENTS else -1
    )
    long_events = ev.filter(pa.array(dur > threshold))
    first = int(start.min()) if n else 0
    end = min(int(_ends(start, dur).max()) + 1, END_LIMIT) if n else 1  # windows: [start, end)
    steps = tuple(
        {"step": s.step, "rank": s.rank, "start_ns": s.start_ns, "dur_ns": s.dur_ns}
        for s in profile.manifest.steps
    )
    narrow = np.int16 if n_lanes < 2**15 else np.int32
    return TimelineIndex(lanes, threshold, long_events, first, end, steps, _fit(start, dur),
                         lane.astype(narrow), depth.astype(np.int8))  # fmt: skip


def _fit(start_ns: np.ndarray, dur_ns: np.ndarray) -> tuple[int, int, int] | None:
    """Where the events are, when a few strays far from the rest would leave most of the whole
    view empty: the largest gap between events (from the furthest end reached so far to the
    next start) splits them; when one side holds at most STRAY_SHARE of them (or two) and the
    gap is over STRAY_STRETCH times the other side's span, the view fits the other side.
    Returns (start, end, events outside), or None. Float arithmetic: only huge gaps matter."""
    n = len(start_ns)
    if n < 3:
        return None
    st = start_ns.astype(np.float64)
    en = st + dur_ns.astype(np.float64)
    if not np.all(st[1:] >= st[:-1]):  # files are sorted by (rank, start): one rank is in order
        order = np.argsort(st, kind="stable")
        st, en = st[order], en[order]
    reach = np.maximum.accumulate(en)
    gaps = st[1:] - reach[:-1]
    i = int(np.argmax(gaps))
    gap, before, after = gaps[i], i + 1, n - i - 1
    few = max(2, int(n * STRAY_SHARE))
    if after <= few and gap > STRAY_STRETCH * max(reach[i] - st[0], 1):
        lo, hi, outside = st[0], reach[i], after
    elif before <= few and gap > STRAY_STRETCH * max(reach[-1] - st[i + 1], 1):
        lo, hi, outside = st[i + 1], reach[-1], before
    else:
        return None
    pad = (hi - lo) / 20
    return (int(max(lo - pad, st[0])), int(min(hi + pad, reach[-1])) + 1, int(outside))


def window_events(profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int) -> pa.Table:
    """The events overlapping [start_ns, end_ns): the short ones read by start (push-down), the
    long ones from the index."""
    thr = index.long_threshold_ns
    short = _short_events(profile, start_ns - max(thr, 0), start_ns, end_ns, thr)
    if short is None:  # many row groups: one scan, filtered as it reads
        short_filter = (
            (pc.field("start_ns") < end_ns)
            & (pc.field("start_ns") >= start_ns - max(thr, 0))
            & (pc.field("dur_ns") <= thr)
            & ((pc.field("start_ns") + pc.field("dur_ns")) >= start_ns)
        )
        short = profile.table("events", columns=WINDOW_COLUMNS, filter=short_filter)
    le = index.long_events
    long_mask = pc.and_(
        pc.less(le.column("start_ns"), end_ns),
        pc.greater_equal(pc.add(le.column("start_ns"), le.column("dur_ns")), start_ns),
    )
    parts = [short.cast(le.schema) if short.schema != le.schema else short, le.filter(long_mask)]
    return pa.concat_tables(parts)


def lanes_and_depths(
    profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The events overlapping the window, with each one's lane and depth in the window."""
    whole = start_ns <= index.start_ns and end_ns >= index.end_ns
    if whole and len(index.event_lane) == profile.row_count("events"):  # every event is in it
        t = profile.table("events", columns=["id", "start_ns", "dur_ns", "name", "kind"])
        return t, index.event_lane.astype(np.int32), index.event_depth.astype(np.int32)
    if len(index.row_lane):  # a streamed index's lanes and depths, by row position
        return rows_window(profile, index, start_ns, end_ns, DRAWN_COLUMNS)
    t = window_events(profile, index, start_ns, end_ns)
    lane = lane_of(t, index)
    known = lane >= 0  # every event has its lane; a lane the index lacks is not drawn
    if not known.all():
        t, lane = t.filter(pa.array(known)), lane[known]
    depth = depths(t.column("id").to_numpy(), t.column("parent_id").fill_null(-1).to_numpy(), lane)
    return t, lane, depth


def _short_events(
    profile: Profile, lo: int, start_ns: int, end_ns: int, thr: int
) -> pa.Table | None:
    """The events starting in [lo, end_ns) no longer than `thr` that reach `start_ns`, read by
    row group (event_groups.read_starting; the filter window_events' scan applies, in numpy);
    None when they span too many groups."""
    t = read_starting(profile, WINDOW_COLUMNS, lo, end_ns)
    if t is None or t.column("start_ns").null_count or t.column("dur_ns").null_count:
        return None
    start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
    keep = (start < end_ns) & (start >= lo) & (dur <= thr) & (start + dur >= start_ns)
    return t.filter(pa.array(keep))


def rows_window(
    profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int, columns: list[str]
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """lanes_and_depths from a streamed index's per-row lanes and depths: the short events of
    the row groups whose starts can overlap, only `columns` read, then the long ones (their
    depths among themselves, as timeline_batches reads them)."""
    parts, lanes, deps = [], [], []
    for t, lane, depth in short_rows(profile, index, start_ns, end_ns, columns):
        parts.append(t)
        lanes.append(lane)
        deps.append(depth)
    long, lane, depth = long_rows(index, start_ns, end_ns)
    long = long.select(columns)
    parts = [p.cast(long.schema) if p.schema != long.schema else p for p in parts]
    return (pa.concat_tables([*parts, long]), np.concatenate([*lanes, lane]).astype(np.int32),
            np.concatenate([*deps, depth]).astype(np.int32))  # fmt: skip


def short_rows(
    profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int, columns: list[str],
    batch_size: int | None = None, every: bool = False,
) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray]]:  # fmt: skip
    """The events no longer than the index's long threshold that overlap the window (`every`:
    all the events, the window aside), a row group (or `batch_size` rows of one) at a time,
    with their lanes and depths from the index's per-row arrays (kept only when no start or
    duration is null)."""
    thr = index.long_threshold_ns
    lo = start_ns - max(thr, 0)
    read = list(dict.fromkeys(["start_ns", "dur_ns", *columns]))
    for t, first in group_tables_at(profile, read, lo, end_ns):
        start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
        if every:
            rows = np.arange(len(start))
        else:
            keep = (start < end_ns) & (start >= lo) & (dur <= thr) & (start + dur >= start_ns)
            rows = np.flatnonzero(keep)
        t = t.select(columns).take(pa.array(rows)) if len(rows) < len(start) else t.select(columns)
        rows += first
        lane, depth = index.row_lane[rows].astype(np.int64), index.row_depth[rows].astype(np.int32)
        size = batch_size or max(t.num_rows, 1)
        for i in range(0, t.num_rows, size):
            yield t.slice(i, size), lane[i : i + size], depth[i : i + size]


def long_rows(
    index: TimelineIndex, start_ns: int, end_ns: int
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The index's long events overlapping the window, on lanes it knows, with their lanes
    and their depths among themselves."""
    le = index.long_events
    overlap = pc.and_(
        pc.less(le.column("start_ns"), end_ns),
        pc.greater_equal(pc.add(le.column("start_ns"), le.column("dur_ns")), start_ns),
    )
    long = le.filter(overlap)
    lane = lane_of(long, index)
    long, lane = long.filter(pa.array(lane >= 0)), lane[lane >= 0]
    ids = long.column("id").to_numpy()
    depth = depths(ids, long.column("parent_id").fill_null(-1).to_numpy(), lane)
    return long, lane, depth

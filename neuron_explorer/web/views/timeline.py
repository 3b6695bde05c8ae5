"""The timeline: lanes for every host thread and device track on one time axis, and any time
window reduced on the server to at most a few thousand rectangles.

Pattern: a window query reads only the row groups whose start_ns can overlap it (predicate
push-down); events longer than a per-profile threshold are few and kept in memory, so the
push-down bound stays tight. Algorithm: events at least one bucket wide are kept; narrower ones
on the same lane and nesting depth are merged per bucket (one pixel, doubled until the result
fits), and each merged rectangle says how many events it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from neuron_explorer.model import Profile
from neuron_explorer.vocab.engines import lane_order
from neuron_explorer.vocab.intervals import depths  # deeper nesting than 64 draws at 64

MAX_RECTS = 4000
LONG_EVENTS = 20_000  # the longest events, kept in memory for every window
_WINDOW_COLUMNS = ["id", "parent_id", "rank", "layer", "device", "track", "start_ns", "dur_ns",
                   "name", "kind"]  # fmt: skip


END_LIMIT = 2**63 - 1  # event ends are clamped here: int64, whatever a malformed event says
# the whole view fits the events when strays (a share of at most STRAY_SHARE, or two events,
# at either end) stretch the extent to more than STRAY_STRETCH times the span of the rest
STRAY_SHARE = 0.001
STRAY_STRETCH = 3


@dataclass(frozen=True)
class TimelineIndex:
    """What every window of one profile shares: lanes, extent, the long events."""

    lanes: pa.Table  # rank, layer, device, track, lane, depth, events
    long_threshold_ns: int
    long_events: pa.Table
    start_ns: int
    end_ns: int
    steps: tuple[dict[str, int], ...]
    fit: tuple[int, int, int] | None = None  # (start, end, events outside) when strays stretch it


def _lane_sort_key(row: dict[str, Any]) -> tuple:
    """Host lanes first, then each device's lanes in the vocabulary's order (vocab/engines.py)."""
    track = row["track"] or ""
    host = row["layer"] == "host"
    order = (0, 0, (len(track), track)) if host else lane_order(track)
    return (row["rank"], not host, row["device"] or "", order)


def _lane_codes(con, table: pa.Table, lanes: pa.Table) -> pa.Table:
    con.register("_w", table)
    con.register("_lanes", lanes)
    try:
        return con.sql(
            "SELECT w.id, coalesce(w.parent_id, -1) AS parent_id, l.lane, w.start_ns, w.dur_ns, "
            "w.name, w.kind FROM _w w JOIN _lanes l ON w.rank = l.rank AND w.layer = l.layer "
            "AND w.device IS NOT DISTINCT FROM l.device AND w.track = l.track"
        ).to_arrow_table()
    finally:
        con.unregister("_w")
        con.unregister("_lanes")


def build_index(profile: Profile, con) -> TimelineIndex:
    """Lanes with their nesting depth, the profile's extent and its longest events."""
    rows = con.execute(
        "SELECT rank, CAST(layer AS VARCHAR) AS layer, CAST(device AS VARCHAR) AS device, "
        "CAST(track AS VARCHAR) AS track, count(*) AS events, min(start_ns) AS s, "
        # ends in HUGEINT: a malformed event near int64's limit must not overflow the sum
        f"least(max(CAST(start_ns AS HUGEINT) + dur_ns), {END_LIMIT}) AS e FROM events GROUP BY ALL"
    ).fetchall()
    keys = ("rank", "layer", "device", "track", "events", "s", "e")
    lane_rows = sorted((dict(zip(keys, r, strict=True)) for r in rows), key=_lane_sort_key)
    lanes = pa.table({
        "rank": pa.array([r["rank"] for r in lane_rows], pa.int32()),
        "layer": pa.array([r["layer"] for r in lane_rows], pa.string()),
        "device": pa.array([r["device"] for r in lane_rows], pa.string()),
        "track": pa.array([r["track"] for r in lane_rows], pa.string()),
        "lane": pa.array(range(len(lane_rows)), pa.int32()),
        "events": pa.array([r["events"] for r in lane_rows], pa.int64()),
    })  # fmt: skip
    ev = profile.table("events", columns=["id", "parent_id", "rank", "layer", "device", "track",
                                          "start_ns", "dur_ns"])  # fmt: skip
    con.register("_ev", ev)
    con.register("_lanes", lanes)
    try:
        coded = con.sql(
            "SELECT w.id, coalesce(w.parent_id, -1) AS parent_id, l.lane FROM _ev w JOIN _lanes l "
            "ON w.rank = l.rank AND w.layer = l.layer AND w.track = l.track "
            "AND w.device IS NOT DISTINCT FROM l.device"
        ).to_arrow_table()
    finally:
        con.unregister("_ev")
        con.unregister("_lanes")
    lane_of = coded.column("lane").to_numpy()
    depth = depths(coded.column("id").to_numpy(), coded.column("parent_id").to_numpy(), lane_of)
    max_depth = np.zeros(len(lane_rows), dtype=np.int32)
    np.maximum.at(max_depth, lane_of, depth)
    lanes = lanes.append_column("depth", pa.array(max_depth + 1, pa.int32()))

    n = profile.row_count("events")
    if n > LONG_EVENTS:
        threshold = con.execute(
            f"SELECT dur_ns FROM events ORDER BY dur_ns DESC LIMIT 1 OFFSET {LONG_EVENTS}"
        ).fetchall()[0][0]
    else:
        threshold = -1
    long_events = profile.table("events", columns=_WINDOW_COLUMNS,
                                filter=pc.field("dur_ns") > threshold)  # fmt: skip
    start = min((r["s"] for r in lane_rows), default=0)
    end = min(max((r["e"] for r in lane_rows), default=0) + 1, END_LIMIT)  # windows: [start, end)
    steps = tuple(
        {"step": s.step, "rank": s.rank, "start_ns": s.start_ns, "dur_ns": s.dur_ns}
        for s in profile.manifest.steps
    )
    fit = _fit(ev.column("start_ns").to_numpy(), ev.column("dur_ns").to_numpy())
    return TimelineIndex(lanes, int(threshold), long_events, int(start), int(end), steps, fit)


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


def lanes_json(index: TimelineIndex) -> list[dict[str, Any]]:
    return index.lanes.to_pylist()


def window(
    profile: Profile, con, index: TimelineIndex, start_ns: int, end_ns: int, width_px: int,
    max_rects: int = MAX_RECTS,
) -> dict[str, Any]:  # fmt: skip
    """The events overlapping [start_ns, end_ns), reduced for a view `width_px` pixels wide."""
    start_ns, end_ns = int(start_ns), int(max(end_ns, start_ns + 1))
    width_px = int(min(max(width_px, 50), 8000))
    short_filter = (
        (pc.field("start_ns") < end_ns)
        & (pc.field("start_ns") >= start_ns - max(index.long_threshold_ns, 0))
        & (pc.field("dur_ns") <= index.long_threshold_ns)
        & ((pc.field("start_ns") + pc.field("dur_ns")) >= start_ns)
    )
    short = profile.table("events", columns=_WINDOW_COLUMNS, filter=short_filter)
    le = index.long_events
    long_mask = pc.and_(
        pc.less(le.column("start_ns"), end_ns),
        pc.greater_equal(pc.add(le.column("start_ns"), le.column("dur_ns")), start_ns),
    )
    parts = [short.cast(le.schema) if short.schema != le.schema else short, le.filter(long_mask)]
    t = _lane_codes(con, pa.concat_tables(parts), index.lanes)
    total = t.num_rows
    ids = t.column("id").to_numpy()
    lane = t.column("lane").to_numpy()
    depth = depths(ids, t.column("parent_id").to_numpy(), lane)
    start = t.column("start_ns").to_numpy()
    dur = t.column("dur_ns").to_numpy()
    ns_per_px = (end_ns - start_ns) / width_px

    factor = 1.0
    while True:
        bucket_ns = ns_per_px * factor
        small = dur < bucket_ns
        bucket = np.floor((np.maximum(start, start_ns) - start_ns) / bucket_ns).astype(np.int64)
        key = (lane.astype(np.int64) * 128 + np.minimum(depth, 127)) * (width_px * 2 + 4) + bucket
        n_groups = len(np.unique(key[small])) + int((~small).sum())
        if n_groups <= max_rects or factor > width_px:
            break
        factor *= 2
    rects = _reduce(con, t, lane, depth, small, key)
    names = rects.column("name").to_pylist()
    name_table = sorted(set(names), key=lambda x: (x is None, x))
    name_idx = {n: i for i, n in enumerate(name_table)}
    out = {c: rects.column(c).to_pylist() for c in ("lane", "depth", "start_ns", "dur_ns", "id",
                                                     "count", "kind")}  # fmt: skip
    out["name"] = [name_idx[n] for n in names]
    return {
        "start_ns": start_ns,
        "end_ns": end_ns,
        "width_px": width_px,
        "events": total,
        "rects_count": rects.num_rows,
        "merged": sum(c for c in out["count"] if c > 1),
        "bucket_ns": bucket_ns,
        "names": name_table,
        "rects": out,
    }


def _reduce(con, t: pa.Table, lane, depth, small, key) -> pa.Table:
    full = t.append_column("depth", pa.array(depth, pa.int32()))
    full = full.append_column("small", pa.array(small)).append_column("k", pa.array(key))
    con.register("_r", full)
    try:
        return con.sql(
            "SELECT lane, depth, start_ns, dur_ns, id, 1 AS count, CAST(name AS VARCHAR) AS name, "
            "CAST(kind AS VARCHAR) AS kind FROM _r WHERE NOT small UNION ALL "
            "SELECT any_value(lane), any_value(depth), min(start_ns), "
            "max(start_ns + dur_ns) - min(start_ns), arg_max(id, dur_ns), count(*), "
            "CASE WHEN count(DISTINCT name) = 1 THEN CAST(any_value(name) AS VARCHAR) "
            "ELSE CAST(count(*) AS VARCHAR) || ' events' END, "
            "CAST(arg_max(kind, dur_ns) AS VARCHAR) FROM _r WHERE small GROUP BY k "
            "ORDER BY 1, 2, 3"
        ).to_arrow_table()
    finally:
        con.unregister("_r")

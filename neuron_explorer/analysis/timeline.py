"""The timeline page: lanes for every host thread and device track on one time axis, and any
time window reduced to at most a few thousand rectangles (the index all windows share is
analysis/timeline_index.py).

Pattern: a window query reads only the row groups whose start_ns can overlap it (predicate
push-down); events longer than a per-profile threshold are few and kept in memory, so the
push-down bound stays tight. Algorithm: events at least one bucket wide are kept; narrower ones
on the same lane and nesting depth are merged per bucket (one pixel, doubled until the result
fits), and each merged rectangle says how many events it holds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from ..vocab.intervals import depths  # deeper nesting than 64 draws at 64
from .page import PageModel, is_modeled
from .timeline_batches import reduce_batched, window_rows
from .timeline_index import WINDOW_COLUMNS, TimelineIndex, build_index, lane_of
from .timeline_stream import BATCH_ROWS

__all__ = ["MAX_RECTS", "TimelineIndex", "TimelinePage", "TimelineWindow", "build_index",
           "timeline_page", "window"]  # fmt: skip

MAX_RECTS = 4000
# a window whose row groups hold more rows than this, on an index without per-event arrays (a
# profile over the server's ceiling), is reduced in batches: ~1 GB of working memory at most
BATCHED_ROWS = 1 << 20
RECT_COLUMNS = ("lane", "depth", "start_ns", "dur_ns", "id", "count", "kind")


@dataclass(frozen=True)
class Rects:
    """The rectangles of a window, as columns; `name` indexes the window's `names`."""

    columns: dict[str, list[Any]]

    def to_dict(self) -> dict[str, list[Any]]:
        return self.columns


@dataclass(frozen=True)
class TimelineWindow(PageModel):
    """The events overlapping [start_ns, end_ns) for a view `width_px` wide: `events` of them
    drawn as `rects_count` rectangles, `merged` of them merged `bucket_ns` wide."""

    start_ns: int
    end_ns: int
    width_px: int
    events: int
    rects_count: int
    merged: int
    bucket_ns: float
    names: tuple[str | None, ...]
    rects: Rects

    def to_dict(self) -> dict[str, Any]:  # plain already: no walk over thousands of values
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**out, "names": list(self.names), "rects": self.rects.to_dict()}


@dataclass(frozen=True)
class TimelinePage(PageModel):
    """The timeline's document: the profile's extent, where its events are (`fit`, None when
    nothing strays), its lanes and steps, and one window."""

    device_time_modeled: bool
    extent: dict[str, int]
    fit: dict[str, int] | None
    lanes: pa.Table
    steps: tuple[dict[str, int], ...]
    window: TimelineWindow

    def to_dict(self) -> dict[str, Any]:
        """The document, built without walking each value: a window is asked for at every
        zoom, and a long profile has tens of thousands of steps (13,042: 40 ms under load)."""
        return {
            "device_time_modeled": self.device_time_modeled,
            "extent": dict(self.extent),
            "fit": None if self.fit is None else dict(self.fit),
            "lanes": self.lanes.to_pylist(),
            "steps": [dict(s) for s in self.steps],
            "window": self.window.to_dict(),
        }

    def window_only(self) -> dict[str, Any]:
        """The document of a zoom or pan, which has the lanes and steps already: the window.
        A long profile's steps are most of the page's bytes (13,042 steps: 0.9 MB)."""
        return {"device_time_modeled": self.device_time_modeled, "window": self.window.to_dict()}


def first_view(index: TimelineIndex) -> tuple[int, int]:
    """The window a visit starts with: where the events are (all of them unless strays)."""
    return index.fit[:2] if index.fit else (index.start_ns, index.end_ns)


def timeline_page(profile: Profile, index: TimelineIndex, win: TimelineWindow) -> TimelinePage:
    """The timeline page of `profile` showing `win` (a `window` of the same index)."""
    fit = index.fit
    return TimelinePage(
        device_time_modeled=is_modeled(profile),
        extent={"start_ns": index.start_ns, "end_ns": index.end_ns},
        fit=None if fit is None else {"start_ns": fit[0], "end_ns": fit[1], "outside_events": fit[2]},
        lanes=index.lanes,
        steps=index.steps,
        window=win,
    )  # fmt: skip


def _window_events(profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int) -> pa.Table:
    """The events overlapping [start_ns, end_ns): the short ones read by start (push-down), the
    long ones from the index."""
    short_filter = (
        (pc.field("start_ns") < end_ns)
        & (pc.field("start_ns") >= start_ns - max(index.long_threshold_ns, 0))
        & (pc.field("dur_ns") <= index.long_threshold_ns)
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


def _lanes_and_depths(
    profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The events overlapping the window, with each one's lane and depth in the window."""
    whole = start_ns <= index.start_ns and end_ns >= index.end_ns
    if whole and len(index.event_lane) == profile.row_count("events"):  # every event is in it
        t = profile.table("events", columns=["id", "start_ns", "dur_ns", "name", "kind"])
        return t, index.event_lane.astype(np.int32), index.event_depth.astype(np.int32)
    t = _window_events(profile, index, start_ns, end_ns)
    lane = lane_of(t, index)
    known = lane >= 0  # every event has its lane; a lane the index lacks is not drawn
    if not known.all():
        t, lane = t.filter(pa.array(known)), lane[known]
    depth = depths(t.column("id").to_numpy(), t.column("parent_id").fill_null(-1).to_numpy(), lane)
    return t, lane, depth


def window(
    profile: Profile, index: TimelineIndex, start_ns: int, end_ns: int, width_px: int,
    max_rects: int = MAX_RECTS, con: Any = None, batched: bool | None = None,
    batch_size: int = BATCH_ROWS,
) -> TimelineWindow:  # fmt: skip
    """The events overlapping [start_ns, end_ns), reduced for a view `width_px` pixels wide
    (`con`: a DuckDB connection to reuse, else one of its own). `batched`: read in batches of
    `batch_size` rows (None: when the index has no per-event arrays and the row groups the
    window reads hold over BATCHED_ROWS)."""
    start_ns, end_ns = int(start_ns), int(max(end_ns, start_ns + 1))
    width_px = int(min(max(width_px, 50), 8000))
    if batched is None:
        batched = not len(index.event_lane) and (
            window_rows(profile, index, start_ns, end_ns) > BATCHED_ROWS
        )
    if batched:  # more events than memory should hold at once: reduced batch by batch
        n, bucket_ns, rects = reduce_batched(profile, index, start_ns, end_ns, width_px,
                                             max_rects, con, batch_size)  # fmt: skip
        return _window(start_ns, end_ns, width_px, n, bucket_ns, rects)
    t, lane, depth = _lanes_and_depths(profile, index, start_ns, end_ns)
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
    return _window(start_ns, end_ns, width_px, t.num_rows, bucket_ns, rects)


def _window(
    start_ns: int, end_ns: int, width_px: int, events: int, bucket_ns: float, rects: pa.Table
) -> TimelineWindow:
    """The window of these rectangles (window()'s _reduce columns), names as indices."""
    names = rects.column("name").to_pylist()
    name_table = sorted(set(names), key=lambda x: (x is None, x))
    name_idx = {n: i for i, n in enumerate(name_table)}
    out = {c: rects.column(c).to_pylist() for c in RECT_COLUMNS}
    out["name"] = [name_idx[n] for n in names]
    return TimelineWindow(
        start_ns=start_ns, end_ns=end_ns, width_px=width_px, events=events,
        rects_count=rects.num_rows, merged=sum(c for c in out["count"] if c > 1),
        bucket_ns=bucket_ns, names=tuple(name_table), rects=Rects(out),
    )  # fmt: skip


def _reduce(con: Any, t: pa.Table, lane, depth, small, key) -> pa.Table:
    """The rectangles: each wide event, and per key the small ones merged (the longest one,
    then the first by id, names the merged rectangle, so two runs give the same answer)."""
    import duckdb

    con = con if con is not None else duckdb.connect()
    full = pa.table({"lane": pa.array(lane, pa.int32()), "depth": pa.array(depth, pa.int32()),
                     "start_ns": t.column("start_ns"), "dur_ns": t.column("dur_ns"),
                     "id": t.column("id"), "name": t.column("name"), "kind": t.column("kind"),
                     "small": pa.array(small), "k": pa.array(key)})  # fmt: skip
    con.register("_r", full)
    try:
        return con.sql(
            "SELECT lane, depth, start_ns, dur_ns, id, 1 AS count, CAST(name AS VARCHAR) AS name, "
            "CAST(kind AS VARCHAR) AS kind FROM _r WHERE NOT small UNION ALL "
            "SELECT any_value(lane), any_value(depth), min(start_ns), "
            "max(start_ns + dur_ns) - min(start_ns), arg_max(id, (dur_ns, -id)), count(*), "
            "CASE WHEN count(DISTINCT name) = 1 THEN CAST(any_value(name) AS VARCHAR) "
            "ELSE CAST(count(*) AS VARCHAR) || ' events' END, "
            "CAST(arg_max(kind, (dur_ns, -id)) AS VARCHAR) FROM _r WHERE small GROUP BY k "
            "ORDER BY 1, 2, 3, 5"
        ).to_arrow_table()
    finally:
        con.unregister("_r")

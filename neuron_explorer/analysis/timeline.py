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

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pyarrow as pa

from ..model.profile import Profile
from .page import PageModel, is_modeled
from .search import _name_codes
from .timeline_batches import reduce_batched, window_rows
from .timeline_index import TimelineIndex, build_index, lanes_and_depths
from .timeline_lod import Pyramid, level_for, reduce_from_pyramid
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
    lod_level: int | None = None  # the pyramid's level it was merged from (timeline_lod)

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
    t, lane, depth = lanes_and_depths(profile, index, start_ns, end_ns)
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


def lod_window(
    profile: Profile, index: TimelineIndex, pyr: Pyramid, start_ns: int, end_ns: int,
    width_px: int, max_rects: int = MAX_RECTS,
) -> TimelineWindow | None:  # fmt: skip
    """window() merged from the pyramid's level nearest a pixel (not wider), reading events
    only at its two edges; None when no level is that fine."""
    start_ns, end_ns = int(start_ns), int(max(end_ns, start_ns + 1))
    width_px = int(min(max(width_px, 50), 8000))
    level = level_for(pyr, (end_ns - start_ns) / width_px)
    if level is None:
        return None
    n, bucket_ns, rects = reduce_from_pyramid(profile, index, pyr, level, start_ns, end_ns,
                                              width_px, max_rects)  # fmt: skip
    return replace(_window(start_ns, end_ns, width_px, n, bucket_ns, rects), lod_level=level)


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
    then the first by id, names the merged rectangle, so two runs give the same answer). In
    numpy (a window of 190,000 events: 64 ms of DuckDB's, of 167); in DuckDB (`_reduce_sql`,
    which refuses it) when a small event's end overflows int64."""
    start, dur = t.column("start_ns").to_numpy(), t.column("dur_ns").to_numpy()
    sm = np.flatnonzero(small)
    if len(sm) and bool((dur[sm] > np.iinfo(np.int64).max - np.maximum(start[sm], 0)).any()):
        return _reduce_sql(con, t, lane, depth, small, key)
    ids = t.column("id").to_numpy()
    codes, names = _name_codes(t.column("name"))
    wide = np.flatnonzero(~small)
    order = sm[np.lexsort((ids[sm], -dur[sm], key[sm]))]  # a group's longest, then lowest id
    k = key[order]
    first = np.flatnonzero(np.r_[True, k[1:] != k[:-1]]) if len(k) else np.zeros(0, np.int64)

    def per_group(ufunc: Any, values: np.ndarray) -> np.ndarray:
        return ufunc.reduceat(values[order], first) if len(k) else values[:0]

    # count(DISTINCT name) = 1 over the names present (nulls aside): that name, else "N events"
    code64 = codes.astype(np.int64)
    low = per_group(np.minimum, np.where(code64 < 0, np.iinfo(np.int64).max, code64))
    high = per_group(np.maximum, code64)
    count = np.diff(np.r_[first, len(order)]).astype(np.int64)
    g_start = per_group(np.minimum, start)
    pick = np.r_[wide, order[first]]
    out_start = np.r_[start[wide], g_start]
    out_ids = ids[pick]
    sort = np.lexsort((out_ids, out_start, depth[pick], lane[pick]))
    counts = np.r_[np.ones(len(wide), np.int64), count][sort]
    named = np.r_[codes[wide], np.where((low == high) & (high >= 0), high, -1)][sort]
    values = names.cast(pa.string()).to_pylist()
    label = [values[c] if c >= 0 else None for c in named.tolist()]
    merged = np.r_[np.zeros(len(wide), bool), ~((low == high) & (high >= 0))][sort]
    for i in np.flatnonzero(merged).tolist():
        label[i] = f"{counts[i]} events"
    kind = t.column("kind").take(pa.array(pick[sort], pa.int64())).cast(pa.string())
    return pa.table({
        "lane": pa.array(lane[pick][sort], pa.int32()),
        "depth": pa.array(depth[pick][sort], pa.int32()),
        "start_ns": out_start[sort],
        "dur_ns": np.r_[dur[wide], per_group(np.maximum, start + dur) - g_start][sort],
        "id": out_ids[sort], "count": counts, "name": pa.array(label, pa.string()),
        "kind": kind,
    })  # fmt: skip


def _reduce_sql(con: Any, t: pa.Table, lane, depth, small, key) -> pa.Table:
    """_reduce in DuckDB (which refuses a sum past int64 as an error)."""
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

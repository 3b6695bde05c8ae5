"""The timeline's web adapter: neuron_explorer.analysis.timeline computes the index, the
windows and the page; the web only caches them (web/service.py) and adds the profile's name."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from neuron_explorer.analysis import timeline as _timeline
from neuron_explorer.analysis.timeline import MAX_RECTS, TimelineIndex, TimelineWindow, first_view
from neuron_explorer.analysis.timeline_batches import window_rows
from neuron_explorer.analysis.timeline_lod import (
    LEVEL_SHIFTS,
    LOD_EVENTS,
    Pyramid,
    pyramid_from_parts,
    pyramid_parts,
)
from neuron_explorer.analysis.timeline_lod_build import build_pyramid, default_buckets
from neuron_explorer.analysis.timeline_stream import BATCH_ROWS, build_index_streamed
from neuron_explorer.model import Profile

__all__ = [
    "BATCH_ROWS",
    "LEVEL_SHIFTS",
    "LOD_EVENTS",
    "MAX_RECTS",
    "Pyramid",
    "TimelineIndex",
    "TimelineWindow",
    "build_index",
    "build_index_streamed",
    "build_pyramid",
    "default_buckets",
    "first_view",
    "index_from_parts",
    "index_parts",
    "lod_window",
    "page",
    "pyramid_from_parts",
    "pyramid_parts",
    "window",
    "window_from_dict",
    "window_rows",
]


def build_index(profile: Profile, con: Any = None) -> TimelineIndex:
    """analysis.timeline.build_index (`con` is not needed: kept for the service's call)."""
    return _timeline.build_index(profile)


def window(
    profile: Profile, con: Any, index: TimelineIndex, start_ns: int, end_ns: int, width_px: int,
    max_rects: int = MAX_RECTS, batched: bool | None = None, batch_size: int = BATCH_ROWS,
) -> TimelineWindow:  # fmt: skip
    """analysis.timeline.window on the server thread's own DuckDB connection `con`."""
    return _timeline.window(profile, index, start_ns, end_ns, width_px, max_rects, con=con,
                            batched=batched, batch_size=batch_size)  # fmt: skip


def lod_window(
    profile: Profile, index: TimelineIndex, pyr: Pyramid, start_ns: int, end_ns: int,
    width_px: int,
) -> TimelineWindow | None:  # fmt: skip
    """analysis.timeline.lod_window (merged in numpy: no DuckDB connection)."""
    return _timeline.lod_window(profile, index, pyr, start_ns, end_ns, width_px)


def index_parts(index: TimelineIndex) -> tuple[dict[str, Any], Any, Any, Any]:
    """A streamed index as the disk cache keeps it: its scalars (JSON), lanes, long events and
    each row's lane and depth (Arrow tables); it holds no per-event arrays, so this is all."""
    meta = {"long_threshold_ns": index.long_threshold_ns, "start_ns": index.start_ns,
            "end_ns": index.end_ns, "fit": None if index.fit is None else list(index.fit)}  # fmt: skip
    rows = pa.table({"lane": index.row_lane, "depth": index.row_depth})
    # one dictionary a column: an Arrow IPC file holds no other
    return meta, index.lanes, index.long_events.unify_dictionaries().combine_chunks(), rows


def index_from_parts(
    profile: Profile, meta: dict[str, Any], lanes: Any, long: Any, rows: Any
) -> TimelineIndex:
    """The index `index_parts` kept (the steps read again from the manifest; the rows' arrays
    read in place from the file's bytes)."""
    steps = tuple(
        {"step": s.step, "rank": s.rank, "start_ns": s.start_ns, "dur_ns": s.dur_ns}
        for s in profile.manifest.steps
    )
    fit = meta["fit"]
    lane, depth = (rows.column(c).to_numpy() for c in ("lane", "depth"))
    return TimelineIndex(lanes, meta["long_threshold_ns"], long, meta["start_ns"],
                         meta["end_ns"], steps, None if fit is None else tuple(fit),
                         row_lane=lane, row_depth=depth)  # fmt: skip


def window_from_dict(d: dict[str, Any]) -> TimelineWindow:
    """A window from its document (TimelineWindow.to_dict, as the disk cache keeps it)."""
    from neuron_explorer.analysis.timeline import Rects

    return TimelineWindow(**{**d, "names": tuple(d["names"]), "rects": Rects(d["rects"])})


def page(
    name: str, profile: Profile, index: TimelineIndex, win: TimelineWindow, window_only: bool
) -> dict[str, Any]:
    """The timeline's JSON twin: analysis.timeline.timeline_page plus the profile's name (only
    its window with `window_only`)."""
    model = _timeline.timeline_page(profile, index, win)
    return {"name": name, **(model.window_only() if window_only else model.to_dict())}

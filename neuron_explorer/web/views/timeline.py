"""The timeline's web adapter: neuron_explorer.analysis.timeline computes the index, the
windows and the page; the web only caches them (web/service.py) and adds the profile's name."""

from __future__ import annotations

from typing import Any

from neuron_explorer.analysis import timeline as _timeline
from neuron_explorer.analysis.timeline import MAX_RECTS, TimelineIndex, TimelineWindow, first_view
from neuron_explorer.analysis.timeline_batches import window_rows
from neuron_explorer.analysis.timeline_stream import BATCH_ROWS, build_index_streamed
from neuron_explorer.model import Profile

__all__ = [
    "BATCH_ROWS",
    "MAX_RECTS",
    "TimelineIndex",
    "TimelineWindow",
    "build_index",
    "build_index_streamed",
    "first_view",
    "page",
    "window",
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


def page(
    name: str, profile: Profile, index: TimelineIndex, win: TimelineWindow, window_only: bool
) -> dict[str, Any]:
    """The timeline's JSON twin: analysis.timeline.timeline_page plus the profile's name (only
    its window with `window_only`)."""
    model = _timeline.timeline_page(profile, index, win)
    return {"name": name, **(model.window_only() if window_only else model.to_dict())}

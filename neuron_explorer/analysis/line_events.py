"""The events of one source line, for the timeline to highlight (the source view's "show on the
timeline"): every event whose own line, model line or Python stack names `file`:`line`.

Pattern: a hot line in the source view is a set of events spread over the whole run; the
timeline shows them all at once, outlined, and steps through them in time order.
Algorithm: one DuckDB query over events (and stacks for the frames), in time order; the first
`limit` are returned with their places, and the total is counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .page import PageModel

MAX_EVENTS = 5000  # highlighted at once; the count says how many there are in all


@dataclass(frozen=True)
class LineEvents(PageModel):
    """The events at `file`:`line`, the first `limit` in time order."""

    file: str
    line: int
    total: int
    truncated: bool
    matches: tuple[dict[str, Any], ...]  # id, kind, name, layer, device, track, start_ns, dur_ns


def line_events(con: Any, file: str, line: int, limit: int = MAX_EVENTS) -> LineEvents:
    """Every event at `file`:`line` (its own line, its model line, or a frame of its stack)."""
    limit = max(1, min(int(limit), MAX_EVENTS))
    where = """(src_file = $file AND src_line = $line) OR (model_file = $file AND model_line = $line)
        OR stack_id IN (SELECT stack_id FROM stacks WHERE file = $file AND line = $line)"""
    params = {"file": file, "line": int(line)}
    total = con.execute(f"SELECT count(*) FROM events WHERE {where}", params).fetchall()[0][0]
    rel = con.execute(
        f"""SELECT id, CAST(kind AS VARCHAR) AS kind, CAST(name AS VARCHAR) AS name,
            CAST(layer AS VARCHAR) AS layer, CAST(device AS VARCHAR) AS device,
            CAST(track AS VARCHAR) AS track, rank, start_ns, dur_ns
            FROM events WHERE {where} ORDER BY start_ns, id LIMIT {limit}""",
        params,
    )
    names = [d[0] for d in rel.description]
    matches = tuple(dict(zip(names, r, strict=True)) for r in rel.fetchall())
    return LineEvents(file, int(line), int(total), int(total) > len(matches), matches)

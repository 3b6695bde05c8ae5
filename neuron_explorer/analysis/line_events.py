"""The events of one source line, or of one nn.Module, for the timeline to highlight (the source
view's and the Modules page's "show on the timeline"): every event whose own line, model line or
Python stack names `file`:`line`; every event run inside a module or one of its submodules.

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
    where = """(src_file = $file AND src_line = $line) OR (model_file = $file AND model_line = $line)
        OR stack_id IN (SELECT stack_id FROM stacks WHERE file = $file AND line = $line)"""
    total, matches = _matching(con, where, {"file": file, "line": int(line)}, limit)
    return LineEvents(file, int(line), total, total > len(matches), matches)


@dataclass(frozen=True)
class ModuleEvents(PageModel):
    """The events run inside the nn.Module `module` ("" is the model) or its submodules, the
    first `limit` in time order: its host ops and the device kernels they launched."""

    module: str
    total: int
    truncated: bool
    matches: tuple[dict[str, Any], ...]


def module_events(con: Any, module: str, limit: int = MAX_EVENTS) -> ModuleEvents:
    """Every event whose module path is `module` or lies below it (a profile without module
    paths has none)."""
    cols = {r[0] for r in con.execute("DESCRIBE events").fetchall()}
    if "module" not in cols:
        return ModuleEvents(module, 0, False, ())
    # a prefix test, not LIKE: a module path may hold "_" or "%"
    where = """module IS NOT NULL AND ($module = '' OR CAST(module AS VARCHAR) = $module
        OR starts_with(CAST(module AS VARCHAR), $module || '.'))"""
    total, matches = _matching(con, where, {"module": module}, limit)
    return ModuleEvents(module, total, total > len(matches), matches)


def _matching(con: Any, where: str, params: dict[str, Any], limit: int) -> tuple[int, tuple]:
    """How many events match `where`, and the first `limit` of them in time order."""
    limit = max(1, min(int(limit), MAX_EVENTS))
    total = con.execute(f"SELECT count(*) FROM events WHERE {where}", params).fetchall()[0][0]
    rel = con.execute(
        f"""SELECT id, CAST(kind AS VARCHAR) AS kind, CAST(name AS VARCHAR) AS name,
            CAST(layer AS VARCHAR) AS layer, CAST(device AS VARCHAR) AS device,
            CAST(track AS VARCHAR) AS track, rank, start_ns, dur_ns
            FROM events WHERE {where} ORDER BY start_ns, id LIMIT {limit}""",
        params,
    )
    names = [d[0] for d in rel.description]
    return int(total), tuple(dict(zip(names, r, strict=True)) for r in rel.fetchall())

"""The event view: one event in full, its columns, the events around it, its flow partners
(the launching call or the device work it caused) and the source line it belongs to."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .page import PageModel, fetch_rows

_COLS = (
    "id, rank, CAST(layer AS VARCHAR) AS layer, CAST(kind AS VARCHAR) AS kind, "
    "CAST(name AS VARCHAR) AS name, CAST(track AS VARCHAR) AS track, "
    "CAST(device AS VARCHAR) AS device, start_ns, dur_ns, parent_id, flow_id, step, stack_id, "
    "CAST(src_file AS VARCHAR) AS src_file, src_line, CAST(src_func AS VARCHAR) AS src_func, "
    "CAST(op_name AS VARCHAR) AS op_name, shapes, dtypes, flops, bytes_read, bytes_written, args, "
    "CAST(module AS VARCHAR) AS module, CAST(model_file AS VARCHAR) AS model_file, model_line"
)
_BRIEF = (
    "id, parent_id, rank, CAST(device AS VARCHAR) AS device, CAST(layer AS VARCHAR) AS layer, CAST(kind AS VARCHAR) AS kind, "
    "CAST(name AS VARCHAR) AS name, CAST(track AS VARCHAR) AS track, start_ns, dur_ns, "
    "CAST(src_file AS VARCHAR) AS src_file, src_line"
)


def _rows(con, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    return list(fetch_rows(con, sql, params))


def _link(row: dict[str, Any]) -> dict[str, Any] | None:
    if row.get("src_file") and row.get("src_line"):
        return {"file": row["src_file"], "line": row["src_line"]}
    return None


@dataclass(frozen=True)
class EventDetail(PageModel):
    """One event in full: its columns (args parsed), its enclosing events (the direct parent
    first), its children, its flow partners (and a collective's other ranks), the source line
    it belongs to and its whole stack (innermost first)."""

    event: dict[str, Any]
    ancestors: tuple[dict[str, Any], ...]
    children: tuple[dict[str, Any], ...]
    flows: tuple[dict[str, Any], ...]
    source: dict[str, Any] | None
    stack: tuple[dict[str, Any], ...]


def event_detail(con, event_id: int, events_file: str | None = None) -> EventDetail | None:
    """The event `event_id` of the profile behind `con` (a DuckDB connection), None if none.
    `events_file`: the events table's own Parquet file, when it is one: the lookups by parent
    and by flow read it with DuckDB's reader, whose row-group statistics skip what cannot
    match (a dataset's scan reads every row group of a column with nulls: a second of CPU
    each on 38 M events, against tens of ms)."""
    table, pre = ("read_parquet(?)", [str(events_file)]) if events_file else ("events", [])
    found = _rows(con, f"SELECT {_COLS} FROM events WHERE id = ?", [event_id])
    if not found:
        return None
    ev = found[0]
    try:
        ev["args"] = json.loads(ev["args"]) if ev["args"] else {}
    except ValueError:
        pass
    ancestors = _ancestors(con, ev["parent_id"])
    children = _rows(
        con,
        f"SELECT {_BRIEF} FROM {table} WHERE parent_id = ? ORDER BY start_ns LIMIT 50",
        [*pre, event_id],
    )
    flows = (
        # the other ends of the flow, not this event's own children (a kernel's DMAs share it)
        _rows(
            con,
            f"SELECT {_BRIEF} FROM {table} WHERE flow_id = ? AND id <> ? "
            "AND parent_id IS DISTINCT FROM ? ORDER BY start_ns LIMIT 50",
            [*pre, ev["flow_id"], event_id, event_id],
        )
        if ev["flow_id"] is not None
        else []
    )
    flows += _collective_peers(con, ev)
    # the line: its own, else its launch's, else the nearest enclosing event's that has one
    source = _link(ev)
    for other in (*flows, *ancestors):
        if source:
            break
        source = _link(other)
    return EventDetail(ev, tuple(ancestors), tuple(children), tuple(flows), source,
                       tuple(_stack(con, ev["stack_id"])))  # fmt: skip


def _ancestors(con, parent_id: int | None) -> list[dict[str, Any]]:
    """The enclosing events, the direct parent first (level 0), up to 32 levels: one lookup by
    id a level, which the Parquet row groups' id ranges answer without a scan (a recursive
    join held every event's id in a hash table: out of memory on a 38 M-event profile)."""
    out: list[dict[str, Any]] = []
    while parent_id is not None and len(out) <= 32:
        found = _rows(con, f"SELECT {_BRIEF} FROM events WHERE id = ?", [parent_id])
        if not found:
            break
        out.append({**found[0], "lvl": len(out)})
        parent_id = found[0]["parent_id"]
    return out


def _collective_peers(con, ev: dict[str, Any]) -> list[dict[str, Any]]:
    """The same collective on the other ranks of its group (neuron captures name each by its
    group and number in args), so each rank's side links to the others'."""
    args = ev.get("args")
    if ev.get("kind") != "collective" or not isinstance(args, dict) or "seq" not in args:
        return []
    return _rows(
        con,
        f"SELECT {_BRIEF} FROM events WHERE kind = 'collective' AND layer = 'device' "
        "AND rank <> ? AND json_extract_string(args, '$.group') = ? "
        "AND CAST(json_extract(args, '$.seq') AS BIGINT) = ? ORDER BY rank LIMIT 64",
        [ev["rank"], str(args.get("group", "")), int(args["seq"])],
    )


def _stack(con, stack_id: int | None) -> list[dict[str, Any]]:
    """The event's whole Python stack, innermost first."""
    if stack_id is None:
        return []
    return _rows(
        con,
        "SELECT depth, CAST(file AS VARCHAR) AS file, line, CAST(function AS VARCHAR) AS function, "
        "CAST(scope AS VARCHAR) AS scope FROM stacks WHERE stack_id = ? ORDER BY depth LIMIT 200",
        [stack_id],
    )

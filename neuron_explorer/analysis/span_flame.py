"""The flame graph of a span of the timeline (Perfetto's flame graph of an area selection): every
event's time inside the span, summed by its nesting path of names.

Pattern: an event's path is the names of the events enclosing it (`parent_id`, on its own
track) down to its own name; events with no enclosing event in the span are roots. Algorithm:
one recursive query walks the events overlapping the span from the roots down, summing each
path's time inside the span (clipped) and counting its events; a path whose time is under
`MIN_SHARE` of the span's total is left out (with its descendants) and counted in `dropped`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .page import PageModel
from .span import Lane, lane_filter

MIN_SHARE = 0.001  # paths narrower than this share of the root are too thin to draw
MAX_NODES = 3000


@dataclass(frozen=True)
class FlameNode:
    """One path of names: its parent's `id` (-1 for the root), its time inside the span, the
    part of it not in a child (`self_ns`), and how many events it sums."""

    id: int
    parent: int
    name: str
    kind: str
    depth: int
    total_ns: int
    self_ns: int
    count: int


@dataclass(frozen=True)
class SpanFlame(PageModel):
    """The flame graph of [start_ns, end_ns): node 0 is the whole span's total (every root
    path's time); `dropped` paths were too thin to keep."""

    start_ns: int
    end_ns: int
    total_ns: int
    dropped: int
    nodes: tuple[FlameNode, ...]


_PATHS = """
WITH RECURSIVE w AS (
  SELECT id, parent_id, CAST(name AS VARCHAR) AS name, CAST(kind AS VARCHAR) AS kind,
         least(start_ns + dur_ns, ?) - greatest(start_ns, ?) AS inside_ns
  FROM events WHERE start_ns < ? AND start_ns + dur_ns > ? AND dur_ns > 0 AND {lanes}),
p AS (
  SELECT id, [coalesce(name, '')] AS path FROM w
  WHERE parent_id IS NULL OR parent_id NOT IN (SELECT id FROM w)
  UNION ALL
  SELECT w.id, list_append(p.path, coalesce(w.name, '')) FROM w JOIN p ON w.parent_id = p.id)
SELECT p.path, mode(w.kind) AS kind, sum(w.inside_ns)::BIGINT AS total_ns, count(*) AS n
FROM p JOIN w USING (id) GROUP BY p.path
"""


def span_flame(
    con: Any, start_ns: int, end_ns: int, lanes: Sequence[Lane] | None = None
) -> SpanFlame:
    """The flame graph of [start_ns, end_ns) of the profile behind `con` (a DuckDB connection),
    of `lanes` only when given."""
    s, e = int(start_ns), int(max(end_ns, start_ns + 1))
    on_lanes, lane_params = lane_filter(lanes)
    rows = con.execute(_PATHS.format(lanes=on_lanes), [e, s, e, s, *lane_params]).fetchall()
    paths = {tuple(path): (kind or "", int(total), int(n)) for path, kind, total, n in rows}
    total = sum(v[1] for k, v in paths.items() if len(k) == 1)
    nodes = [FlameNode(0, -1, "selection", "", 0, total, 0, 0)]
    ids: dict[tuple[str, ...], int] = {(): 0}
    child_sum = [0]
    keep = max(1, int(total * MIN_SHARE))
    dropped = 0
    # parents before children; the heaviest sibling first
    for path in sorted(paths, key=lambda k: (len(k), -paths[k][1], k)):
        kind, t, n = paths[path]
        parent = ids.get(path[:-1])
        if parent is None or t < keep or len(nodes) >= MAX_NODES:
            dropped += 1
            continue
        ids[path] = len(nodes)
        child_sum[parent] += t
        child_sum.append(0)
        nodes.append(FlameNode(len(nodes), parent, path[-1], kind, len(path), t, 0, n))
    out = tuple(
        FlameNode(**{**n.__dict__, "self_ns": max(0, n.total_ns - child_sum[n.id])}) for n in nodes
    )
    return SpanFlame(start_ns=s, end_ns=e, total_ns=total, dropped=dropped, nodes=out)

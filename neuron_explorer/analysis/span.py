"""Totals for a span of the timeline (Perfetto's area selection): the time every event spends
inside the span (clipped to it), by layer and kind, by op, by kernel and by lane, with counts.
Nested events each count their own time, as in Perfetto: an op and the ops inside it both do."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..vocab.kinds import DEVICE_WORK_KINDS, KERNEL_KINDS, sql_list
from .page import PageModel, fetch_rows

TOP = 20
# device work, an engine's instructions included (a span shows what each lane did)
DEVICE_WORK = (*DEVICE_WORK_KINDS, "instruction")


# a lane: (rank, layer, device, track), as the timeline's lanes are keyed
Lane = tuple[int | None, str, str | None, str]


def lane_filter(lanes: Sequence[Lane] | None) -> tuple[str, list[Any]]:
    """An SQL condition on `events` that keeps only `lanes` (all when None), and its parameters."""
    if lanes is None:
        return "TRUE", []
    one = ("(rank IS NOT DISTINCT FROM ? AND CAST(layer AS VARCHAR) = ? "
           "AND CAST(device AS VARCHAR) IS NOT DISTINCT FROM ? AND CAST(track AS VARCHAR) = ?)")  # fmt: skip
    return "(" + (" OR ".join([one] * len(lanes)) or "FALSE") + ")", [
        v for lane in lanes for v in lane
    ]


@dataclass(frozen=True)
class SpanTotals(PageModel):
    """What ran in [start_ns, end_ns): how many events, and their time inside it by layer and
    kind, by op, by kernel and by device lane (with its busy share of the span)."""

    start_ns: int
    end_ns: int
    dur_ns: int
    events: int
    by_kind: tuple[dict[str, Any], ...]
    ops: tuple[dict[str, Any], ...]
    kernels: tuple[dict[str, Any], ...]
    lanes: tuple[dict[str, Any], ...]


def span_totals(con, start_ns: int, end_ns: int, lanes: Sequence[Lane] | None = None) -> SpanTotals:
    """What ran in [start_ns, end_ns) of the profile behind `con` (a DuckDB connection), on
    `lanes` only when given (Perfetto's area selection: a time range on the tracks dragged over)."""
    s, e = int(start_ns), int(max(end_ns, start_ns + 1))
    on_lanes, lane_params = lane_filter(lanes)
    inside = (
        "WITH w AS (SELECT CAST(layer AS VARCHAR) AS layer, CAST(kind AS VARCHAR) AS kind, "
        "CAST(name AS VARCHAR) AS name, CAST(track AS VARCHAR) AS track, "
        "CAST(device AS VARCHAR) AS device, rank, "
        "least(start_ns + dur_ns, ?) - greatest(start_ns, ?) AS inside_ns FROM events "
        "WHERE ((start_ns < ? AND start_ns + dur_ns > ?) OR (dur_ns = 0 AND start_ns >= ? AND start_ns < ?)) "
        f"AND {on_lanes}) "
    )
    params = [e, s, e, s, s, e, *lane_params]
    kinds = sql_list(DEVICE_WORK)

    def q(select: str) -> tuple[dict[str, Any], ...]:
        return fetch_rows(con, inside + select, params)

    return SpanTotals(
        start_ns=s,
        end_ns=e,
        dur_ns=e - s,
        events=q("SELECT count(*) AS n FROM w")[0]["n"],
        by_kind=q("SELECT layer, kind, count(*) AS count, sum(inside_ns) AS time_ns FROM w "
                     "GROUP BY ALL ORDER BY time_ns DESC, layer, kind"),
        ops=q("SELECT name, count(*) AS count, sum(inside_ns) AS time_ns FROM w "
                 f"WHERE layer = 'host' AND kind = 'op' GROUP BY ALL ORDER BY time_ns DESC, name LIMIT {TOP}"),
        kernels=q("SELECT name, kind, count(*) AS count, sum(inside_ns) AS time_ns FROM w "
                     f"WHERE kind IN {sql_list(KERNEL_KINDS)} GROUP BY ALL ORDER BY time_ns DESC, name, kind LIMIT {TOP}"),
        # busy share of each device lane (engine, DMA queue, stream) over the span
        lanes=q("SELECT rank, device, track, count(*) AS count, sum(inside_ns) AS time_ns, "
                   f"sum(inside_ns) / {float(e - s)} AS busy FROM w "
                   f"WHERE layer = 'device' AND kind IN {kinds} GROUP BY ALL ORDER BY time_ns DESC, rank, device, track LIMIT {TOP}"),
    )  # fmt: skip

"""The allocations alive at the memory peak, from a memory snapshot's `allocation` events
(importers/memory_snapshot.py): each with its size, its source line and its module, their sums
by line and by module, and how much of it was allocated before the history began. Where a
profile has allocation events, the bytes alive at the peak are the peak itself (the importer
builds the counter from the same allocations)."""

from __future__ import annotations

from typing import Any

from .page import fetch_rows

TOP = 25
_BYTES = "CAST(json_extract(args, '$.bytes') AS BIGINT)"
_ALIVE = ("FROM events WHERE kind = 'allocation' AND rank = ? AND CAST(device AS VARCHAR) = ? "
          "AND start_ns <= ? AND start_ns + dur_ns > ?")  # fmt: skip
# a line: the innermost user frame, else the innermost model-code frame (a library's)
_FILE = "coalesce(CAST(src_file AS VARCHAR), CAST(model_file AS VARCHAR))"
_LINE = "coalesce(src_line, model_line)"
_FUNC = "coalesce(CAST(src_func AS VARCHAR), CAST(model_func AS VARCHAR))"


def alive_at_peak(con, rank: int, device: str, ts_ns: int) -> dict[str, Any] | None:
    """The allocations on `device` alive at `ts_ns` (None when the profile has none at all)."""
    kinds = con.execute("SELECT count(*) FROM events WHERE kind = 'allocation'").fetchone()
    if not kinds or not kinds[0]:
        return None
    params = [rank, device, ts_ns, ts_ns]
    before = "coalesce(CAST(json_extract(args, '$.before_history') AS BOOLEAN), false)"
    total = con.execute(
        f"SELECT count(*), coalesce(sum({_BYTES}), 0), count(*) FILTER ({before}), "
        f"coalesce(sum({_BYTES}) FILTER ({before}), 0) {_ALIVE}",
        params,
    ).fetchone()
    largest = list(fetch_rows(con, (
        f"SELECT id, {_BYTES} AS bytes, start_ns, {_FILE} AS file, {_LINE} AS line, "
        f"{_FUNC} AS func, CAST(module AS VARCHAR) AS module, "
        f"{before} AS before_history "
        f"{_ALIVE} ORDER BY bytes DESC, start_ns, id LIMIT {TOP}"), params))  # fmt: skip
    by_line = list(fetch_rows(con, (
        f"SELECT {_FILE} AS file, {_LINE} AS line, any_value({_FUNC}) AS func, "
        f"sum({_BYTES}) AS bytes, count(*) AS allocations {_ALIVE} AND {_FILE} IS NOT NULL "
        f"GROUP BY 1, 2 ORDER BY bytes DESC, 1, 2 LIMIT {TOP}"), params))  # fmt: skip
    by_module = list(fetch_rows(con, (
        f"SELECT CASE WHEN CAST(module AS VARCHAR) = '' THEN '(model)' ELSE CAST(module AS VARCHAR) "
        f"END AS module, sum({_BYTES}) AS bytes, count(*) AS allocations {_ALIVE} "
        f"AND module IS NOT NULL GROUP BY 1 ORDER BY bytes DESC, 1 LIMIT {TOP}"), params))  # fmt: skip
    return {"count": int(total[0]), "bytes": int(total[1]),
            "before_history": {"count": int(total[2]), "bytes": int(total[3])},
            "largest": largest, "by_line": by_line, "by_module": by_module}  # fmt: skip

"""Memory over time, from the counters table: each counter's samples reduced for a chart
(the minimum and maximum of every bucket, so a peak is never smoothed away), its peak, and what
was held at the peak of memory_allocated by op and by source line.

What was held at the peak is split into the baseline (already allocated when the step holding
the peak began) and the step's own growth up to the peak: each change between two samples is
charged to the innermost host op running at the sample, so an op's share is what it allocated
minus what it freed, up to the peak. A counter has no addresses, so a tensor freed by a later
op is charged to the op that freed it, and the shares add up to the growth exactly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model.profile import Profile
from .memory_alive import alive_at_peak
from .page import PageModel, fetch_rows


def _dicts(con, sql: str, params: list[Any] | tuple = ()) -> list[dict[str, Any]]:  # mutable rows
    return list(fetch_rows(con, sql, params))


MAX_POINTS = 2000  # buckets per counter in a chart; each sends its min and max
TOP = 25
PEAK_COUNTER = "memory_allocated"


def counter_series(con, start_ns: int | None = None, end_ns: int | None = None,
                   points: int = MAX_POINTS) -> list[dict[str, Any]]:  # fmt: skip
    """Every counter (rank, track, name, unit) with its samples in [start_ns, end_ns] reduced
    to at most `points` buckets: ts_ns (bucket start), min, max and last, plus the count."""
    where, params = "", []
    if start_ns is not None and end_ns is not None:
        where, params = "WHERE ts_ns BETWEEN ? AND ?", [int(start_ns), int(end_ns)]
    keys = _dicts(
        con,
        f"SELECT rank, CAST(track AS VARCHAR) AS track, CAST(name AS VARCHAR) AS name, "
        f"any_value(CAST(unit AS VARCHAR)) AS unit, count(*) AS samples, min(ts_ns) AS t0, "
        f"max(ts_ns) AS t1, max(value) AS peak, arg_max(ts_ns, value) AS peak_ts_ns "
        f"FROM counters {where} GROUP BY ALL ORDER BY rank, track, name",
        params,
    )
    for k in keys:
        span = max(1, (k["t1"] - k["t0"] + 1))
        bucket = max(1, -(-span // max(1, int(points))))
        rows = con.execute(
            f"SELECT (ts_ns - ?) // ? AS b, min(ts_ns), min(value), max(value), arg_max(value, ts_ns) "
            f"FROM counters WHERE rank = ? AND CAST(track AS VARCHAR) = ? AND "
            f"CAST(name AS VARCHAR) = ? {where.replace('WHERE', 'AND')} GROUP BY b ORDER BY b",
            [k["t0"], bucket, k["rank"], k["track"], k["name"], *params],
        ).fetchall()
        k["bucket_ns"] = bucket
        k["ts_ns"] = [r[1] for r in rows]
        k["min"] = [r[2] for r in rows]
        k["max"] = [r[3] for r in rows]
        k["last"] = [r[4] for r in rows]
        del k["t0"], k["t1"]
    return keys


@dataclass(frozen=True)
class MemoryPage(PageModel):
    """Every counter's series and peak, and what was held at the highest peak of a device's
    memory_allocated (the host's when no device has one), by op, by source line and by
    module (None without such a counter); for a memory snapshot's profile, the allocations
    alive at that peak."""

    counters: tuple[dict[str, Any], ...]
    peak: dict[str, Any] | None
    # a memory snapshot's allocations alive at the peak (memory_alive.py)
    alive: dict[str, Any] | None = None


def memory_page(profile: Profile, con) -> MemoryPage:
    """The memory page of `profile` (`con`: a DuckDB connection over its tables)."""
    series = counter_series(con)
    allocated = [s for s in series if s["name"] == PEAK_COUNTER]
    # a device's memory is what runs out first: its peak, else the host's
    devices = [s for s in allocated if s["track"] != "cpu"] or allocated
    top = max(devices, key=lambda s: s["peak"], default=None)
    if top is None:
        return MemoryPage(tuple(series), None)
    alive = alive_at_peak(con, top["rank"], top["track"], int(top["peak_ts_ns"]))
    return MemoryPage(tuple(series), _at_peak(profile, con, top), alive)


def _at_peak(profile: Profile, con, top: dict[str, Any]) -> dict[str, Any]:
    peak_ts = int(top["peak_ts_ns"])
    step = next((s for s in profile.manifest.steps if s.rank == top["rank"]
                 and s.start_ns <= peak_ts < s.start_ns + s.dur_ns), None)  # fmt: skip
    since = step.start_ns if step else None
    key = [top["rank"], top["track"], PEAK_COUNTER]
    samples = ("SELECT ts_ns, value, value - lag(value, 1, 0) OVER (ORDER BY ts_ns, value) AS delta "
               "FROM counters WHERE rank = ? AND CAST(track AS VARCHAR) = ? "
               "AND CAST(name AS VARCHAR) = ?")  # fmt: skip
    baseline = 0.0
    if since is not None:
        before = con.execute(f"SELECT value FROM ({samples}) WHERE ts_ns < ? ORDER BY ts_ns DESC "
                             "LIMIT 1", [*key, since]).fetchall()  # fmt: skip
        baseline = float(before[0][0]) if before else 0.0
    lo = since if since is not None else -(2**62)
    # the module path (profiles of schema 2 on): what a by-module table is made of
    cols = {r[0] for r in con.execute("DESCRIBE events").fetchall()}
    module = "CAST(e.module AS VARCHAR)" if "module" in cols else "CAST(NULL AS VARCHAR)"
    # each change, charged to the innermost host op running at its sample (latest start wins)
    charged = (
        # one row per sample (k): samples of one timestamp are several changes, each charged
        f"WITH d AS (SELECT row_number() OVER () AS k, ts_ns, delta FROM ({samples}) "
        "WHERE ts_ns >= ? AND ts_ns <= ?), "
        "j AS (SELECT d.ts_ns, any_value(d.delta) AS delta, "
        "arg_max(CAST(e.name AS VARCHAR), e.start_ns) AS op, "
        "arg_max(CAST(e.src_file AS VARCHAR), e.start_ns) AS file, "
        "arg_max(e.src_line, e.start_ns) AS line, "
        f"arg_max({module}, e.start_ns) AS module FROM d LEFT JOIN events e "
        "ON e.layer = 'host' AND e.kind = 'op' AND e.rank = ? "
        "AND e.start_ns <= ? AND e.start_ns <= d.ts_ns AND e.start_ns + e.dur_ns > d.ts_ns "
        "GROUP BY d.k, d.ts_ns) SELECT ts_ns, delta, op, file, line, module FROM j"
    )
    # the range join runs once (the events after the peak are skipped by row group); the three
    # tables are sums over its few rows
    j = con.sql(charged, params=[*key, lo, peak_ts, top["rank"], peak_ts]).to_arrow_table()
    con.register("_memory_charged", j)
    try:
        by_op, by_line, by_module = _shares(con)
    finally:
        con.unregister("_memory_charged")
    return {
        "rank": top["rank"], "track": top["track"], "counter": PEAK_COUNTER, "unit": top["unit"],
        "value": top["peak"], "ts_ns": peak_ts, "step": step.step if step else None,
        "since_ns": since, "baseline": baseline, "growth": top["peak"] - baseline,
        "by_op": by_op, "by_line": by_line, "by_module": by_module,
    }  # fmt: skip


def _shares(con):
    """What the charged changes add up to by op, by source line and by module."""
    by_op = _dicts(
        con,
        f"SELECT coalesce(op, '(outside any op)') AS op, sum(delta) AS held_bytes, "
        "sum(greatest(delta, 0)) AS allocated_bytes, count(*) FILTER (WHERE delta > 0) AS allocations "
        f"FROM _memory_charged GROUP BY 1 ORDER BY held_bytes DESC, 1 LIMIT {TOP}",
    )
    by_line = _dicts(
        con,
        f"SELECT file, line, any_value(op) AS op, sum(delta) AS held_bytes, "
        "sum(greatest(delta, 0)) AS allocated_bytes FROM _memory_charged WHERE file IS NOT NULL "
        f"GROUP BY file, line ORDER BY held_bytes DESC, file, line LIMIT {TOP}",
    )
    by_module = _dicts(
        con,
        f"SELECT CASE WHEN module = '' THEN '(model)' ELSE module END AS module, "
        "sum(delta) AS held_bytes, sum(greatest(delta, 0)) AS allocated_bytes FROM _memory_charged "
        f"WHERE module IS NOT NULL GROUP BY 1 ORDER BY held_bytes DESC, 1 LIMIT {TOP}",
    )
    return by_op, by_line, by_module

"""Memory over time, from the counters table: each counter's samples reduced for a chart
(the minimum and maximum of every bucket, so a peak is never smoothed away), its peak, and what
was held at the peak of memory_allocated by op and by source line.

What was held at the peak is split into the baseline (held when the step holding the peak
began; with no sample before it, the first sample's value, as a counter starts with what the
process already held) and what the step's ops allocated and still hold at the peak. A rise of
the counter is charged to the innermost host op running at its sample (its source line and
module with it). A counter has no addresses, so a fall is taken from what is held in proportion
to the holdings, and from the baseline past them: no op or line holds more than it allocated,
and the holdings plus the baseline still held add up to the peak. Samples are read in the order
written: frees cut to one instant share a timestamp."""

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
                   points: int = MAX_POINTS, counters_file: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Every counter (rank, track, name, unit) with its samples in [start_ns, end_ns] reduced
    to at most `points` buckets: ts_ns (bucket start), min, max and last, plus the count.
    Ties are broken by value so that every run gives the same answer (samples at one time: the
    greatest is `last`; a peak reached again: `peak_ts_ns` is its first time).
    `counters_file`: the counters table's own Parquet file, when it is one, read with DuckDB's
    reader (18.5 M samples: 0.2 s, against seconds through the registered dataset)."""
    table, pre = ("read_parquet(?)", [str(counters_file)]) if counters_file else ("counters", [])
    where, params = "", []
    if start_ns is not None and end_ns is not None:
        where, params = "WHERE ts_ns BETWEEN ? AND ?", [int(start_ns), int(end_ns)]
    keys = _dicts(
        con,
        f"SELECT rank, CAST(track AS VARCHAR) AS track, CAST(name AS VARCHAR) AS name, "
        f"any_value(CAST(unit AS VARCHAR)) AS unit, count(*) AS samples, min(ts_ns) AS t0, "
        f"max(ts_ns) AS t1, max(value) AS peak, arg_max(ts_ns, (value, -ts_ns)) AS peak_ts_ns "
        f"FROM {table} {where} GROUP BY ALL ORDER BY rank, track, name",
        [*pre, *params],
    )
    for k in keys:
        span = max(1, (k["t1"] - k["t0"] + 1))
        bucket = max(1, -(-span // max(1, int(points))))
        rows = con.execute(
            "SELECT (ts_ns - ?) // ? AS b, min(ts_ns), min(value), max(value), "
            "arg_max(value, (ts_ns, value)) "
            f"FROM {table} WHERE rank = ? AND CAST(track AS VARCHAR) = ? AND "
            f"CAST(name AS VARCHAR) = ? {where.replace('WHERE', 'AND')} GROUP BY b ORDER BY b",
            [k["t0"], bucket, *pre, k["rank"], k["track"], k["name"], *params],
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
    alive at that peak instead (it has no ops: its peak is where and when, nothing charged)."""

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
    if alive is not None:
        # a memory snapshot's: its allocations say what was held and where each was made, and
        # it has no ops to charge the counter's rises to; a profiler's snapshot has no times
        # (its entries are a nanosecond apart, in order)
        about = profile.manifest.extra.get("memory_snapshot")
        timed = about.get("timed", True) if isinstance(about, dict) else True
        return MemoryPage(tuple(series), _peak(profile, top), {**alive, "timed": bool(timed)})
    return MemoryPage(tuple(series), _at_peak(profile, con, top), alive)


def _peak(profile: Profile, top: dict[str, Any]) -> dict[str, Any]:
    """The peak itself: where, when and in which step."""
    peak_ts = int(top["peak_ts_ns"])
    step = next((s for s in profile.manifest.steps if s.rank == top["rank"]
                 and s.start_ns <= peak_ts < s.start_ns + s.dur_ns), None)  # fmt: skip
    return {"rank": top["rank"], "track": top["track"], "counter": PEAK_COUNTER,
            "unit": top["unit"], "value": top["peak"], "ts_ns": peak_ts,
            "step": step.step if step else None, "since_ns": step.start_ns if step else None}  # fmt: skip


def _at_peak(profile: Profile, con, top: dict[str, Any]) -> dict[str, Any]:
    head = _peak(profile, top)
    peak_ts, since = head["ts_ns"], head["since_ns"]
    key = [top["rank"], top["track"], PEAK_COUNTER]
    # in the order written (k): frees cut to one instant share a timestamp, and any other
    # tie-break turns a run of them into growths and falls
    samples = ("SELECT row_number() OVER () AS k, ts_ns, value FROM counters WHERE rank = ? "
               "AND CAST(track AS VARCHAR) = ? AND CAST(name AS VARCHAR) = ?")  # fmt: skip
    lo = since if since is not None else -(2**62)
    before = con.execute(f"SELECT value FROM ({samples}) WHERE ts_ns < ? ORDER BY ts_ns DESC, k DESC "
                         "LIMIT 1", [*key, lo]).fetchall()  # fmt: skip
    # the module path (profiles of schema 2 on): what a by-module table is made of
    cols = {r[0] for r in con.execute("DESCRIBE events").fetchall()}
    module = "CAST(e.module AS VARCHAR)" if "module" in cols else "CAST(NULL AS VARCHAR)"
    # each sample, with the innermost host op running at it (latest start wins)
    charged = (
        f"WITH d AS (SELECT k, ts_ns, value FROM ({samples}) WHERE ts_ns >= ? AND ts_ns <= ?) "
        "SELECT d.k, d.ts_ns, any_value(d.value) AS value, "
        "arg_max(CAST(e.name AS VARCHAR), e.start_ns) AS op, "
        "arg_max(CAST(e.src_file AS VARCHAR), e.start_ns) AS file, "
        "arg_max(e.src_line, e.start_ns) AS line, "
        f"arg_max({module}, e.start_ns) AS module FROM d LEFT JOIN events e "
        "ON e.layer = 'host' AND e.kind = 'op' AND e.rank = ? "
        "AND e.start_ns <= ? AND e.start_ns <= d.ts_ns AND e.start_ns + e.dur_ns > d.ts_ns "
        "GROUP BY d.k, d.ts_ns ORDER BY d.ts_ns, d.k"
    )
    # the range join runs once (the events after the peak are skipped by row group)
    rows = con.execute(charged, [*key, lo, peak_ts, top["rank"], peak_ts]).fetchall()
    rows = _to_peak(rows, float(top["peak"]))
    # with no sample before the step, the first one's change is unknown (the counter starts
    # with what the process already held, a model's weights): its value was held before
    baseline = float(before[0][0]) if before else (float(rows[0][2]) if rows else 0.0)
    shares, baseline_held = apportion(baseline, [(r[2], r[3:]) for r in rows])
    by_op, by_line, by_module = _tables(shares)
    return {
        **head, "baseline": baseline, "growth": top["peak"] - baseline,
        "baseline_held": baseline_held, "charged": top["peak"] - baseline_held,
        "by_op": by_op, "by_line": by_line, "by_module": by_module,
    }  # fmt: skip


def _to_peak(rows: list[tuple], peak: float) -> list[tuple]:
    """The samples up to the first that reaches the peak (several share its timestamp)."""
    for i, r in enumerate(rows):
        if r[2] >= peak:
            return rows[: i + 1]
    return rows


def apportion(
    baseline: float, samples: list[tuple[float, Any]]
) -> tuple[dict[Any, list[float]], float]:
    """What each charge key (op, file, line, module) still holds at the last of `samples`
    (value, key), with what of `baseline` is still held. A rise is charged to its key; a counter
    has no addresses, so a fall is taken from what the keys hold in proportion to their holdings
    (and from the baseline past them): no key holds more than it allocated, none less than
    nothing, and the holdings and the baseline held add up to the last value. Each value of
    the map is [held, allocated, allocations]."""
    out: dict[Any, list[float]] = {}
    raw: dict[Any, float] = {}  # held = raw * scale: a fall rescales all at once
    scale, held, base = 1.0, 0.0, baseline
    prev = baseline
    for value, key in samples:
        delta, prev = value - prev, value
        if delta > 0:
            raw[key] = raw.get(key, 0.0) + delta / scale
            held += delta
            acc = out.setdefault(key, [0.0, 0.0, 0])
            acc[1] += delta
            acc[2] += 1
        elif delta < 0:
            take = min(-delta, held)
            base -= -delta - take
            if take >= held:
                raw, scale, held = {}, 1.0, 0.0
            else:
                scale *= (held - take) / held
                held -= take
                if scale < 1e-150:  # renormalise before it underflows
                    raw, scale = {k: v * scale for k, v in raw.items()}, 1.0
    for key, acc in out.items():
        acc[0] = raw.get(key, 0.0) * scale
    return out, base


def _tables(shares: dict[Any, list[float]]) -> tuple[list, list, list]:
    """The holdings summed by op, by source line and by module, largest first (TOP of each)."""
    ops: dict[str, list[float]] = {}
    lines: dict[tuple[str, int], list[Any]] = {}
    mods: dict[str, list[float]] = {}
    for (op, file, line, mod), (held, allocated, n) in shares.items():
        o = ops.setdefault(op if op is not None else "(outside any op)", [0.0, 0.0, 0])
        o[0] += held
        o[1] += allocated
        o[2] += n
        if file is not None:
            ln = lines.setdefault((file, line), [0.0, 0.0, {}])
            ln[0] += held
            ln[1] += allocated
            ln[2][op] = ln[2].get(op, 0.0) + allocated
        if mod is not None:
            m = mods.setdefault(mod or "(model)", [0.0, 0.0])
            m[0] += held
            m[1] += allocated
    by_op = [{"op": k, "held_bytes": v[0], "allocated_bytes": v[1], "allocations": v[2]}
             for k, v in ops.items()]  # fmt: skip
    by_line = [{"file": f, "line": n, "op": max(v[2], key=v[2].get) if v[2] else None,
                "held_bytes": v[0], "allocated_bytes": v[1]} for (f, n), v in lines.items()]  # fmt: skip
    by_module = [
        {"module": k, "held_bytes": v[0], "allocated_bytes": v[1]} for k, v in mods.items()
    ]

    def top(rows, *tie):
        return sorted(rows, key=lambda r: (-r["held_bytes"], *(str(r[t]) for t in tie)))[:TOP]

    return top(by_op, "op"), top(by_line, "file", "line"), top(by_module, "module")

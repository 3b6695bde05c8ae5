"""`summarize(profile)`: what ran where and where each step's time went, as dataclasses and
Arrow tables (the `summary` command and the web UI's summary page both render it)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from .context import AnalysisContext, context
from .conventions import (
    COMPILE_GROUP_SQL,
    COMPUTE_KINDS,
    DEVICE_WORK_KINDS,
    DOWNCAST_PREDICATE,
    ENGINE_TRACKS,
    KERNEL_KINDS,
    PROGRAM_SQL,
    TENSOR_ENGINE_TRACK,
    TRANSFER_KINDS,
    sql_list,
)

TOP_N = 15
BREAKDOWN_COLUMNS = (
    "device_compute_ns", "dma_ns", "device_idle_ns", "compile_ns", "fallback_ns", "sync_ns",
    "host_other_ns",
)  # fmt: skip


@dataclass(frozen=True)
class DeviceStats:
    """One device of one rank: how much work it ran and how long it was busy and idle.

    busy_ns is the union of all its work (kernels, copies, DMA, collectives), compute_ns the
    union of its kernels; idle_ns is its active window (first work start to last work end)
    minus busy_ns."""

    rank: int
    device: str
    kernels: int
    collectives: int
    transfers: int
    busy_ns: int
    compute_ns: int
    window_ns: int
    idle_ns: int


@dataclass(frozen=True)
class StepStats:
    count: int
    total_ns: int
    mean_ns: float
    median_ns: float
    min_ns: int
    max_ns: int


@dataclass(frozen=True)
class Breakdown:
    """Step time summed over all profiled steps. Device view: compute + dma + idle = steps
    (device columns are None without device work); host view: compile + fallback + sync +
    host_other = steps."""

    steps_ns: int
    device_compute_ns: int | None
    dma_ns: int | None
    device_idle_ns: int | None
    compile_ns: int
    fallback_ns: int
    sync_ns: int
    host_other_ns: int


@dataclass(frozen=True)
class EngineUtil:
    rank: int
    engine: str
    busy_ns: int
    utilization: float  # busy over the rank's profiled step time


@dataclass(frozen=True)
class Readiness:
    """For moving a model to Trainium: what fell back, what was downcast, what compiling costs."""

    fallback_ops: pa.Table  # op, file, line, func, calls, dur_ns
    downcasts: pa.Table  # op, file, line, calls
    recompiles: pa.Table  # op, recompiles, dur_ns, shapes
    compile_ns: int
    first_step_ns: int | None
    steady_step_ns: float | None  # median of the steps after the first


@dataclass(frozen=True)
class Summary:
    profile: str
    source: str
    ranks: tuple[int, ...]
    n_events: int
    wall_ns: int
    devices: tuple[DeviceStats, ...]
    step_stats: StepStats | None  # None when the profile has no ProfilerStep spans
    breakdown: Breakdown
    steps: pa.Table  # per step: rank, step, start_ns, dur_ns, the Breakdown columns, kernels
    top_ops_self: pa.Table  # host ops: name, calls, self_ns, total_ns
    top_ops_total: pa.Table
    top_kernels: pa.Table  # device kernels: name, device, calls, total_ns, mean_ns, share
    engines: tuple[EngineUtil, ...]
    mfu: float | None  # neuron: TensorE FLOP/s over peak bf16 FLOP/s
    mbu: float | None  # neuron: kernels' HBM bytes/s over peak HBM bytes/s
    readiness: Readiness | None  # neuron profiles only

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


def _plain(x: Any) -> Any:
    if isinstance(x, pa.Table):
        return x.to_pylist()
    if hasattr(x, "__dataclass_fields__"):
        return {f.name: _plain(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def summarize(profile: Profile) -> Summary:
    """Devices, steps, the step-time breakdown, top ops and kernels, engine utilization, MFU and
    MBU, and (for neuron profiles) the readiness block."""
    ctx = context(profile)
    with ctx.lock:
        return _summarize(profile, ctx)


def _summarize(profile: Profile, ctx: AnalysisContext) -> Summary:
    totals = ctx.one(
        "SELECT count(*) AS n, min(start_ns) AS lo, max(start_ns + dur_ns) AS hi FROM ev"
    )
    wall = int((totals.get("hi") or 0) - (totals.get("lo") or 0))
    steps = ctx.breakdown
    neuron = _is_neuron(ctx)
    by_self, by_total = _top_ops(ctx)
    return Summary(
        profile=str(profile.path),
        source=profile.manifest.source,
        ranks=tuple(profile.manifest.ranks),
        n_events=int(totals.get("n") or 0),
        wall_ns=wall,
        devices=_devices(ctx),
        step_stats=_step_stats(steps) if ctx.has_steps else None,
        breakdown=_breakdown(steps),
        steps=steps,
        top_ops_self=by_self,
        top_ops_total=by_total,
        top_kernels=_top_kernels(ctx),
        engines=_engines(ctx),
        mfu=_mfu(ctx) if neuron else None,
        mbu=_mbu(ctx) if neuron else None,
        readiness=_readiness(ctx) if neuron else None,
    )


def _is_neuron(ctx: AnalysisContext) -> bool:
    if ctx.manifest.device_spec:
        return True
    row = ctx.one("SELECT count(*) AS n FROM ev WHERE device LIKE 'neuron%' LIMIT 1")
    return bool(row.get("n"))


def _devices(ctx: AnalysisContext) -> tuple[DeviceStats, ...]:
    work = f"layer = 'device' AND kind IN {sql_list(DEVICE_WORK_KINDS)}"
    part = "rank, device"

    def src(kinds: tuple[str, ...]) -> str:
        return (
            f"SELECT rank, device, start_ns AS s, start_ns + dur_ns AS e FROM ev "
            f"WHERE layer = 'device' AND kind IN {sql_list(kinds)}"
        )

    ctx.merged("dev_busy", src(DEVICE_WORK_KINDS), part)
    ctx.merged("dev_compute", src(COMPUTE_KINDS), part)
    rows = ctx.rows(
        f"""WITH bs AS (SELECT rank, device, sum(e - s) AS busy, max(e) - min(s) AS win
                    FROM dev_busy GROUP BY ALL),
             cs AS (SELECT rank, device, sum(e - s) AS comp FROM dev_compute GROUP BY ALL),
             n AS (SELECT rank, device,
                          count(*) FILTER (WHERE kind IN {sql_list(KERNEL_KINDS)}) AS kernels,
                          count(*) FILTER (WHERE kind = 'collective') AS collectives,
                          count(*) FILTER (WHERE kind IN {sql_list(TRANSFER_KINDS)})
                              AS transfers
                   FROM ev WHERE {work} GROUP BY ALL)
        SELECT n.*, bs.busy, coalesce(cs.comp, 0) AS comp, bs.win
        FROM n JOIN bs USING (rank, device) LEFT JOIN cs USING (rank, device)
        ORDER BY rank, device"""
    )
    return tuple(
        DeviceStats(
            rank=int(r["rank"]),
            device=str(r["device"]),
            kernels=int(r["kernels"]),
            collectives=int(r["collectives"]),
            transfers=int(r["transfers"]),
            busy_ns=int(r["busy"]),
            compute_ns=int(r["comp"]),
            window_ns=int(r["win"]),
            idle_ns=int(r["win"] - r["busy"]),
        )
        for r in rows
    )


def _step_stats(steps: pa.Table) -> StepStats:
    d = steps["dur_ns"]
    return StepStats(
        count=steps.num_rows,
        total_ns=int(pc.sum(d).as_py()),
        mean_ns=float(pc.mean(d).as_py()),
        median_ns=float(pc.approximate_median(d).as_py()),
        min_ns=int(pc.min(d).as_py()),
        max_ns=int(pc.max(d).as_py()),
    )


def _breakdown(steps: pa.Table) -> Breakdown:
    def total(col: str) -> int | None:
        v = pc.sum(steps[col]).as_py()
        return None if v is None else int(v)

    device_cols = ("device_compute_ns", "dma_ns", "device_idle_ns")
    vals = {c: total(c) for c in BREAKDOWN_COLUMNS}
    for c in BREAKDOWN_COLUMNS:
        if c not in device_cols and vals[c] is None:
            vals[c] = 0
    return Breakdown(steps_ns=int(pc.sum(steps["dur_ns"]).as_py() or 0), **vals)  # type: ignore[arg-type]


def _top_ops(ctx: AnalysisContext) -> tuple[pa.Table, pa.Table]:
    """Host ops by self time and by total time; self = dur minus the direct children's."""
    ctx.run(
        """CREATE OR REPLACE TEMP TABLE op_stats AS
        WITH ch AS (SELECT parent_id, sum(dur_ns) AS c FROM ev
                    WHERE parent_id IS NOT NULL AND layer = 'host' GROUP BY 1)
        SELECT name, count(*) AS calls,
               sum(greatest(dur_ns - coalesce(ch.c, 0), 0)) AS self_ns, sum(dur_ns) AS total_ns
        FROM ev LEFT JOIN ch ON ch.parent_id = ev.id
        WHERE layer = 'host' AND kind = 'op' GROUP BY name"""
    )
    return tuple(
        ctx.arrow(f"SELECT * FROM op_stats ORDER BY {order} DESC, name LIMIT {TOP_N}")
        for order in ("self_ns", "total_ns")
    )  # type: ignore[return-value]


def _top_kernels(ctx: AnalysisContext) -> pa.Table:
    return ctx.arrow(
        f"""SELECT name, any_value(device) AS device, count(*) AS calls,
               sum(dur_ns) AS total_ns, avg(dur_ns) AS mean_ns,
               sum(dur_ns) / sum(sum(dur_ns)) OVER () AS share
        FROM ev WHERE layer = 'device' AND kind IN {sql_list(COMPUTE_KINDS)}
        GROUP BY name ORDER BY total_ns DESC, name LIMIT {TOP_N}"""
    )


def _rank_time(ctx: AnalysisContext) -> dict[int, int]:
    ctx.steps()
    return {
        int(r["rank"]): int(r["ns"])
        for r in ctx.rows("SELECT rank, sum(e - s) AS ns FROM steps_w GROUP BY rank")
    }


def _engines(ctx: AnalysisContext) -> tuple[EngineUtil, ...]:
    # the DMA queues count as one engine, busy while any queue moves data
    src = (
        "SELECT rank, CASE WHEN track LIKE 'DMA%' THEN 'DMA' ELSE track END AS track, "
        "start_ns AS s, start_ns + dur_ns AS e FROM ev "
        f"WHERE layer = 'device' AND (track IN {sql_list(ENGINE_TRACKS)} "
        "OR (kind = 'dma' AND track LIKE 'DMA%'))"
    )
    ctx.merged("engine_busy", src, "rank, track")
    rows = ctx.rows(
        "SELECT rank, track, sum(e - s) AS busy FROM engine_busy GROUP BY ALL ORDER BY rank, track"
    )
    denom = _rank_time(ctx)
    return tuple(
        EngineUtil(
            rank=int(r["rank"]),
            engine=str(r["track"]),
            busy_ns=int(r["busy"]),
            utilization=round(int(r["busy"]) / denom[r["rank"]], 6)
            if denom.get(r["rank"])
            else 0.0,
        )
        for r in rows
    )


def _in_steps(ctx: AnalysisContext) -> str:
    return "step IS NOT NULL" if ctx.has_steps else "TRUE"


def _mfu(ctx: AnalysisContext) -> float | None:
    peak = float(ctx.device_spec.get("peak_flops_bf16") or 0)
    secs = ctx.total_step_ns / 1e9
    if peak <= 0 or secs <= 0:
        return None
    row = ctx.one(
        f"""SELECT coalesce(sum(flops) FILTER (WHERE kind = 'instruction'
                        AND track = '{TENSOR_ENGINE_TRACK}'), 0) AS te,
                   coalesce(sum(flops) FILTER (WHERE kind = 'kernel'
                        AND json_extract(args, '$.matmul') IS NOT NULL), 0) AS mm
        FROM ev WHERE layer = 'device' AND {_in_steps(ctx)}"""
    )
    flops = row.get("te") or row.get("mm") or 0
    return float(flops) / secs / peak


def _mbu(ctx: AnalysisContext) -> float | None:
    peak = float(ctx.device_spec.get("hbm_bytes_per_s") or 0)
    secs = ctx.total_step_ns / 1e9
    if peak <= 0 or secs <= 0:
        return None
    row = ctx.one(
        f"""SELECT coalesce(sum(coalesce(bytes_read, 0) + coalesce(bytes_written, 0)), 0) AS b
        FROM ev WHERE layer = 'device' AND kind = 'kernel' AND {_in_steps(ctx)}"""
    )
    return float(row.get("b") or 0) / secs / peak


def _readiness(ctx: AnalysisContext) -> Readiness:
    fallback = ctx.arrow(
        """SELECT coalesce(op_name, name) AS op, src_file AS file, src_line AS line,
               any_value(src_func) AS func, count(*) AS calls, sum(dur_ns) AS dur_ns
        FROM ev WHERE layer = 'host' AND kind = 'fallback'
        GROUP BY 1, 2, 3 ORDER BY dur_ns DESC, op"""
    )
    downcasts = ctx.arrow(
        f"""SELECT coalesce(op_name, name) AS op, src_file AS file, src_line AS line,
               count(*) AS calls
        FROM ev WHERE {DOWNCAST_PREDICATE}
        GROUP BY 1, 2, 3 ORDER BY calls DESC, op"""
    )
    ctx.ensure_recompiles()
    recompiles = ctx.arrow(
        f"""SELECT {COMPILE_GROUP_SQL} AS op,
               count(DISTINCT {PROGRAM_SQL}) AS recompiles,
               sum(dur_ns) AS dur_ns,
               list(DISTINCT coalesce(json_extract_string(args, '$.shapes'), shapes))
                   FILTER (WHERE coalesce(json_extract_string(args, '$.shapes'), shapes)
                           IS NOT NULL) AS shapes
        FROM recompiles GROUP BY 1 ORDER BY dur_ns DESC, op"""
    )
    compile_ns = ctx.one(
        "SELECT coalesce(sum(dur_ns), 0) AS ns FROM ev WHERE layer = 'host' AND kind = 'compile'"
    )["ns"]
    first = steady = None
    if ctx.has_steps:
        row = ctx.one(
            """WITH r AS (SELECT e - s AS d, row_number() OVER (PARTITION BY rank ORDER BY s) AS i
                          FROM steps_w)
            SELECT max(d) FILTER (WHERE i = 1) AS first, median(d) FILTER (WHERE i > 1) AS steady
            FROM r"""
        )
        first = None if row.get("first") is None else int(row["first"])
        steady = None if row.get("steady") is None else float(row["steady"])
    return Readiness(fallback, downcasts, recompiles, int(compile_ns), first, steady)

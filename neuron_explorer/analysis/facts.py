"""The shared facts of a profile: the tables that several rules (and the summary) read, each
built once per profile by the analysis context (context.py) when a query first names it. No
rule builds or changes one; a rule that needs what another rule judges reads the fact both
judge (launch-bound steps, optimizer steps), never the other rule.

TABLES maps each table name to its builder; a builder registers its table (and returns a
value the context keeps, e.g. a count) through the context's private `_execute`/`_register`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ..vocab.kinds import FRAMEWORK_KINDS
from . import intervals
from .conventions import (
    DATALOADER_LIKE,
    DEVICE_WORK_KINDS,
    GRAPH_RECOMPILE_SQL,
    KERNEL_KINDS,
    NEURON_SYNC_KIND,
    RECOMPILE_PREDICATE,
    SYNC_RUNTIME_NAMES,
    TRACE_COMPILE_NAMES,
    sql_list,
    sync_predicate,
)
from .job import ended_ranks

if TYPE_CHECKING:
    from .context import AnalysisContext

# A launch-bound step (launch-bound reports it; device-idle-gaps leaves its idle time alone):
# at least this many kernels, a rank's median kernel under TINY_KERNEL_NS, and idle time no
# more specific rule explains of at least LAUNCH_MIN_IDLE_SHARE of the step.
LAUNCH_MIN_KERNELS_PER_STEP = 50
TINY_KERNEL_NS = 20_000  # a kernel shorter than this costs about as much to launch
LAUNCH_MIN_IDLE_SHARE = 0.30
# An unfused optimizer step (unfused-optimizer reports it; launch-bound's advice names it):
# at least this many host ops inside one Optimizer.step span and no _foreach_/_fused_ op.
OPTIMIZER_MIN_OPS_PER_STEP = 32  # a few ops per parameter for a model of 16+ parameters
# Host runtime calls that set the device up rather than drive it: context creation, stream
# creation, memory reservation, module loading (not the queries torch makes on every op, such
# as cudaGetDevice or cudaDeviceGetStreamPriorityRange, whose first call alone creates the
# context, before any device work). Device idle while the host is in one is start-up (CUDA
# context, cuDNN handles, the caching allocator's first growth), which the fixes for idle gaps
# do not remove.
SETUP_RUNTIME_LIKE = (
    "cudaFree", "cudaMalloc%", "cudaHostAlloc", "cudaStreamCreate%", "cuModuleLoad%",
    "cuCtxCreate%", "cuDevicePrimaryCtxRetain", "cuInit", "hipFree", "hipMalloc%",
    "hipStreamCreate%", "hipHostMalloc", "hipModuleLoad%",
)  # fmt: skip
# a kernel launch this long loads its module on first use (CUDA's lazy loading: seconds); a
# normal launch takes microseconds
SETUP_CALL_NS = 10_000_000
LAUNCH_RUNTIME_LIKE = ("cudaLaunchKernel%", "cuLaunchKernel%", "hipLaunchKernel%")


def steps_w(ctx: AnalysisContext) -> int:
    """`steps_w(rank, step, s, e)`: step windows; returns the number of real (ProfilerStep)
    windows. Without any, one window per rank over all its events (step NULL). The last step of
    a rank whose run an exception ended is left out (job.py): it is partial."""
    ctx._execute(
        """CREATE TEMP TABLE steps_w AS
        SELECT rank, coalesce(step, TRY_CAST(regexp_extract(name, '#(\\d+)', 1) AS INTEGER))
                   AS step,
               min(start_ns) AS s, max(start_ns + dur_ns) AS e
        FROM ev WHERE kind = 'step' AND layer = 'host'
        GROUP BY ALL"""
    )
    ended = ended_ranks(ctx.manifest)
    if ended:  # the step an exception cut short: not a step of the program (analysis/job.py)
        ctx._execute(
            f"""DELETE FROM steps_w WHERE rank IN ({", ".join(str(int(r)) for r in ended)})
            AND s = (SELECT max(s) FROM steps_w w WHERE w.rank = steps_w.rank)
            AND (SELECT count(*) FROM steps_w w WHERE w.rank = steps_w.rank) > 1"""
        )
    n = int(ctx.one("SELECT count(*) AS n FROM steps_w")["n"])
    if n == 0:
        ctx._execute(
            """INSERT INTO steps_w
            SELECT rank, NULL, min(start_ns), max(start_ns + dur_ns) FROM ev GROUP BY rank"""
        )
    return n


def steady_w(ctx: AnalysisContext) -> int:
    """`steady_w(rank, step, s, e)`: the step windows of steady-state figures (the mean step,
    step-time and collective outliers, the straggler): steps_w less each rank's first step in a
    job of several ranks, where that rank has more. The ranks start recording at different
    times, and at the first collective the early ones wait for the last: the start-up skew,
    not the program's. Returns the skew (the spread of the ranks' first step starts, ns)."""
    job = len(ctx.manifest.ranks) > 1 or int(ctx.manifest.extra.get("world_size") or 0) > 1
    ctx._execute(
        f"""CREATE TEMP TABLE steady_w AS
        SELECT * FROM steps_w w WHERE NOT {job} OR w.step IS NULL
           OR w.s > (SELECT min(s) FROM steps_w f WHERE f.rank = w.rank)
           OR (SELECT count(*) FROM steps_w f WHERE f.rank = w.rank) < 2"""
    )
    firsts = ctx.one(
        "SELECT max(s) - min(s) AS skew FROM (SELECT min(s) AS s FROM steps_w GROUP BY rank)"
    )
    return int(firsts.get("skew") or 0) if job else 0


def busy(ctx: AnalysisContext) -> None:
    """`busy(rank, s, e)`: disjoint intervals where the rank's device does any work."""
    ctx._register("busy", ctx.merge_rows(ctx.device_rows(DEVICE_WORK_KINDS)))


def recompiles(ctx: AnalysisContext) -> None:
    """`recompiles`: compile events caused by shapes not seen before: the neuron compiler's
    recompile markers, compiles of a graph's later signatures, and any compile after the first
    step of a rank (the first step compiles everything once)."""
    compiles = ctx.subset("ev_compiles", ctx.cols.where("kind", ("compile",)))
    ctx._execute(
        f"""CREATE TEMP TABLE recompiles AS
        WITH r AS (SELECT rank, e, row_number() OVER (PARTITION BY rank ORDER BY s) AS i,
                          count(*) OVER (PARTITION BY rank) AS n FROM steps_w),
             f AS (SELECT rank, e AS first_end FROM r WHERE i = 1 AND n >= 2
                   AND {int(ctx.has_steps)} = 1)
        SELECT ev.* FROM {compiles} AS ev LEFT JOIN f USING (rank)
        WHERE {RECOMPILE_PREDICATE}
           OR (kind = 'compile' AND layer = 'host'
               AND (start_ns >= f.first_end OR {GRAPH_RECOMPILE_SQL}))"""
    )


def explained(ctx: AnalysisContext) -> None:
    """`explained(rank, s, e)`: host time with a known cause of device idleness (compiles,
    torch.compile's tracing, CPU fallbacks, syncs and data loading), merged per rank."""
    cols = ctx.cols
    kind = cols.where
    rows = cols.where("layer", ("host",)) & (
        kind("kind", ("compile", "fallback", NEURON_SYNC_KIND))  # sync_predicate()
        | (kind("kind", ("runtime",)) & kind("name", SYNC_RUNTIME_NAMES))
        | (kind("kind", FRAMEWORK_KINDS) & cols.like("name", DATALOADER_LIKE))
        | (kind("kind", FRAMEWORK_KINDS) & kind("name", TRACE_COMPILE_NAMES))
    )
    ctx._register("explained", ctx.merge_rows(rows))


def explained_idle(ctx: AnalysisContext) -> None:
    """`explained_idle(rank, start_ns, explained_idle_ns)`: per step window, the device idle
    time that overlaps explained host time (the more specific rules report it)."""
    pieces = ctx.arrow(
        """SELECT w.rank, w.s, greatest(x.s, w.s) AS ws, least(x.e, w.e) AS we
        FROM steps_w w JOIN explained x ON x.rank = w.rank AND x.s < w.e AND x.e > w.s"""
    )
    covered = intervals.covered(ctx.arrow("SELECT * FROM busy"), ["rank"], pieces)
    ctx._register(
        "explained_pieces", pieces.append_column("busy_ns", pa.array(covered, pa.int64()))
    )
    ctx._register(
        "explained_idle",
        ctx.arrow(
            """WITH ex AS (SELECT rank, s, sum(we - ws) - sum(busy_ns) AS ns
                        FROM explained_pieces GROUP BY rank, s)
            SELECT w.rank, w.s AS start_ns, coalesce(ex.ns, 0) AS explained_idle_ns
            FROM steps_w w LEFT JOIN ex USING (rank, s)
            ORDER BY w.rank, w.s"""
        ),
    )


def kernel_medians(ctx: AnalysisContext) -> None:
    """`kernel_medians(rank, med, device)`: each rank's median kernel duration."""
    ctx._register(
        "kernel_medians",
        ctx.arrow(
            f"""SELECT rank, median(dur_ns) AS med, any_value(device) AS device
            FROM {ctx.events_of(KERNEL_KINDS, "device")}
            WHERE layer = 'device' AND kind IN {sql_list(KERNEL_KINDS)} GROUP BY rank"""
        ),
    )


def launch_bound_steps(ctx: AnalysisContext) -> None:
    """`launch_bound_steps`: the breakdown rows of the launch-bound steps plus idle_ns, the
    idle time no more specific rule explains (thresholds above)."""
    tiny = ctx.arrow(f"SELECT rank FROM kernel_medians WHERE med < {TINY_KERNEL_NS}")["rank"]
    if len(tiny) == 0:  # no rank launches tiny kernels: the breakdown is not needed
        names = ("start_ns", "dur_ns", "kernels", "idle_ns")
        empty = pa.table(
            {"rank": pa.array([], pa.int32()), **{n: pa.array([], pa.int64()) for n in names}}
        )
        ctx._register("launch_bound_steps", empty)
        return
    b = ctx.breakdown
    b = b.append_column("idle_ns", pc.subtract(b["device_idle_ns"], _explained_ns(ctx)))
    b = b.filter(pc.is_in(b["rank"], value_set=pa.array(tiny.to_pylist(), pa.int32())))
    b = b.filter(pc.greater_equal(b["kernels"], LAUNCH_MIN_KERNELS_PER_STEP))
    idle = pc.divide(pc.cast(b["idle_ns"], "double"), pc.cast(b["dur_ns"], "double"))
    ctx._register("launch_bound_steps", b.filter(pc.greater_equal(idle, LAUNCH_MIN_IDLE_SHARE)))


def launch_bound_spans(ctx: AnalysisContext) -> None:
    """`launch_bound_spans(rank, s, e)`: the launch-bound steps' windows merged into disjoint
    ones per rank, so which holds a time is one ASOF join (a join on the rank with a range
    paired each of a rank's events with each of its steps: 4.5 s of CPU a query on the 10 GB
    trace's excerpt, 6,070 steps on one rank)."""
    steps = ctx.arrow(
        "SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM launch_bound_steps "
        "WHERE dur_ns > 0"
    )
    ctx._register("launch_bound_spans", intervals.merge(steps, ["rank"]))


def _explained_ns(ctx: AnalysisContext) -> pa.ChunkedArray:
    return ctx.explained_idle["explained_idle_ns"]  # the breakdown's rows, in its order


def optimizer_steps(ctx: AnalysisContext) -> None:
    """`optimizer_ops(oid, id, name, dur_ns, fused)`: the host ops inside each Optimizer.step
    span on its rank and thread; `optimizer_steps(id, name, dur_ns, ops, fused)`: per span,
    how many ops and how many of them multi-tensor/fused."""
    opt = "layer = 'host' AND kind <> 'step' AND is_optimizer"
    # each host op finds the optimizer span around it on its thread: by hash join within the
    # same step when steps are known, else by an ASOF join (the latest span that started
    # before the op); it counts when it also starts before that span ends
    on = "x.rank = o.rank AND x.track = o.track"
    join = f"x JOIN o ON {on} AND x.step = o.step" if ctx.has_steps else f"x ASOF JOIN o ON {on}"
    none = "" if pc.any(ctx.events["is_optimizer"]).as_py() else "AND false"
    ctx._execute(
        f"""CREATE TEMP TABLE optimizer_ops AS
        WITH o AS (SELECT id, rank, track, step, start_ns, start_ns + dur_ns AS end_ns
                   FROM ev WHERE {opt} {none}),
             x AS (SELECT id, rank, track, step, name, start_ns, dur_ns, is_fused FROM ev
                   WHERE layer = 'host' AND kind = 'op' {none})
        SELECT o.id AS oid, x.id, x.name, x.dur_ns, x.is_fused AS fused
        FROM {join} AND x.start_ns >= o.start_ns
        WHERE x.start_ns < o.end_ns"""
    )
    ctx._execute(
        f"""CREATE TEMP TABLE optimizer_steps AS
        SELECT o.id, o.name, o.dur_ns, count(x.id) AS ops,
               count(x.id) FILTER (WHERE x.fused) AS fused
        FROM (SELECT * FROM ev WHERE {opt} {none}) o LEFT JOIN optimizer_ops x ON x.oid = o.id
        GROUP BY o.id, o.name, o.dur_ns"""
    )


def setup_calls(ctx: AnalysisContext) -> None:
    """`setup_calls(rank, s, e)`: host time in runtime calls that set the device up
    (SETUP_RUNTIME_LIKE, or a kernel launch of SETUP_CALL_NS or more), merged per rank."""
    cols = ctx.cols
    runtime = cols.where("layer", ("host",)) & cols.where("kind", ("runtime",))
    loads = cols.like("name", LAUNCH_RUNTIME_LIKE) & (cols.ints("dur_ns") >= SETUP_CALL_NS)
    ctx._register(
        "setup_calls", ctx.merge_rows(runtime & (cols.like("name", SETUP_RUNTIME_LIKE) | loads))
    )


def step_breakdown(ctx: AnalysisContext) -> pa.Table:
    """Per step window: where the time went (ns), one partition of the step (breakdown.py:
    device compute + communication + dma + idle by host cause = dur_ns) and the overlaps shown
    apart; and the host view: compile, fallback and sync wait (events of those kinds clipped to
    the step) and host_other_ns, the rest. Device columns (and device_idle_ns) are NULL on
    ranks without device work."""
    from .breakdown import DEVICE_COLUMNS, OVERLAP_COLUMNS, PARTITION_COLUMNS, per_step

    windows = ctx.arrow("SELECT rank, s, s AS ws, e AS we FROM steps_w")
    covered = intervals.covered(ctx.arrow("SELECT * FROM busy"), ["rank"], windows)
    ctx._register(
        "step_dev", pa.table({"rank": windows["rank"], "s": windows["s"], "ns_busy": covered})
    )
    cols = ctx.cols
    host = cols.where("layer", ("host",))
    sync_rows = (cols.where("kind", (NEURON_SYNC_KIND,)) & host) | (
        cols.where("kind", ("runtime",)) & cols.where("name", SYNC_RUNTIME_NAMES)
    )
    # the few events these joins read, not every event
    ctx.subset("ev_host_x", host & (cols.where("kind", ("compile", "fallback")) | sync_rows))
    kernels = ctx.events_of(KERNEL_KINDS, "device")  # the rules' table of kernels too
    table = ctx.arrow(_breakdown_sql(kernels, sorted(ctx.device_ranks)))
    # the partition, for the same windows in the same order
    ordered = ctx.arrow("SELECT rank, s AS ws, e AS we FROM steps_w ORDER BY rank, s")
    parts = per_step(ctx, ordered)
    has_device = table["has_device"].to_numpy(zero_copy_only=False)
    for name in (*PARTITION_COLUMNS, *OVERLAP_COLUMNS):
        mask = ~has_device if name in DEVICE_COLUMNS else None
        table = table.append_column(name, pa.array(parts[name], pa.int64(), mask=mask))
    return table.drop_columns(["has_device"])


def _breakdown_sql(kernels: str, device_ranks: list[int]) -> str:
    def host_kind(pred: str) -> str:
        return f"""SELECT w.rank, w.s,
                sum(least(x.start_ns + x.dur_ns, w.e) - greatest(x.start_ns, w.s)) AS ns
            FROM steps_w w JOIN ev_host_x x ON x.rank = w.rank AND x.layer = 'host' AND {pred}
                 AND x.start_ns < w.e AND x.start_ns + x.dur_ns > w.s
            GROUP BY ALL"""

    ranks_sql = "(" + ", ".join(str(r) for r in (device_ranks or [-(2**31)])) + ")"
    return f"""
    WITH busy_w AS (SELECT rank, s, ns_busy AS ns FROM step_dev),
    comp_k AS ({host_kind("x.kind = 'compile'")}),
    fall_k AS ({host_kind("x.kind = 'fallback'")}),
    sync_k AS ({host_kind(sync_predicate("x"))}),
    kern AS (SELECT w.rank, w.s, count(*) AS n
             FROM (SELECT rank, start_ns FROM {kernels} WHERE layer = 'device'
                   AND kind IN {sql_list(KERNEL_KINDS)}) k
             ASOF JOIN steps_w w ON k.rank = w.rank AND k.start_ns >= w.s
             WHERE k.start_ns < w.e GROUP BY ALL)
    SELECT w.rank, w.step, w.s AS start_ns, w.e - w.s AS dur_ns,
           w.rank IN {ranks_sql} AS has_device,
           CASE WHEN w.rank IN {ranks_sql} THEN (w.e - w.s) - coalesce(b.ns, 0) END
               AS device_idle_ns,
           coalesce(ck.ns, 0) AS compile_ns, coalesce(fk.ns, 0) AS fallback_ns,
           coalesce(sk.ns, 0) AS sync_ns,
           greatest((w.e - w.s) - coalesce(ck.ns, 0) - coalesce(fk.ns, 0)
                    - coalesce(sk.ns, 0), 0) AS host_other_ns,
           coalesce(k.n, 0) AS kernels
    FROM steps_w w
    LEFT JOIN busy_w b USING (rank, s)
    LEFT JOIN comp_k ck USING (rank, s) LEFT JOIN fall_k fk USING (rank, s)
    LEFT JOIN sync_k sk USING (rank, s) LEFT JOIN kern k USING (rank, s)
    ORDER BY w.rank, w.s
    """


TABLES: dict[str, Callable[[AnalysisContext], Any]] = {
    "steps_w": steps_w,
    "steady_w": steady_w,
    "busy": busy,
    "recompiles": recompiles,
    "explained": explained,
    "explained_idle": explained_idle,
    "kernel_medians": kernel_medians,
    "launch_bound_steps": launch_bound_steps,
    "launch_bound_spans": launch_bound_spans,
    "optimizer_ops": optimizer_steps,
    "optimizer_steps": optimizer_steps,
    "setup_calls": setup_calls,
}
# tables a builder registers on the way (read by the builders only)
INTERNAL = ("step_dev", "explained_pieces")

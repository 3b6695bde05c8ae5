"""compile-dominated: compilation, not steady-state steps, takes the profiled time."""

from __future__ import annotations

from ..context import AnalysisContext
from ..findings import Evidence, Finding
from ..rule import (
    Rule,
    fmt_ms,
    fmt_pct,
    longest_ids,
    register,
    top_lines,
    top_ops,
    torch_compile_trace_ns,
)


@register
class CompileDominated(Rule):
    """Compile time large against steady-state step time.

    Pattern: the first steps compile every op or graph for the device; in a short run (or a
    profile of the first steps) compilation dominates, and the steady-state cost is hidden.
    Algorithm: sum the host compile events that are not recompiles (those are recompilation's
    finding), plus torch.compile's own tracing around them (the outermost dynamo spans, such as
    entire_frame_compile, that hold no recompile, less the compile events inside them: Python
    tracing and AOT autograd that no backend compile event covers); compare the first step of
    each rank with the median
    of its other steps. Report when compile time is at least COMPILE_SHARE of step time, or the
    first step takes at least FIRST_STEP_RATIO times the steady median and contains compiles.
    The saving is the compile time (a warm persistent cache or a warm-up before the measured
    run removes it).
    """

    id = "compile-dominated"
    title = "Compilation dominates the profiled time"
    severity = "medium"
    scope = "neuron"
    COMPILE_SHARE = 0.25
    FIRST_STEP_RATIO = 3.0
    fix = (
        "Warm up before profiling (schedule=torch.profiler.schedule(wait=1, warmup=1, ...)), "
        "keep the compile cache between runs, and compile fewer distinct programs (fixed "
        "shapes, torch.compile one graph instead of many eager ops)."
    )

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        ctx.ensure_recompiles()  # recompiles are recompilation's finding
        where = "layer = 'host' AND kind = 'compile' AND id NOT IN (SELECT id FROM recompiles)"
        agg = ctx.one(f"SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns FROM ev WHERE {where}")
        n, backend_ns = int(agg.get("n") or 0), int(agg.get("ns") or 0)
        step_ns = ctx.total_step_ns
        if n == 0 or step_ns <= 0:
            return []
        trace_ns = torch_compile_trace_ns(ctx, around_recompiles=False)
        ns = backend_ns + trace_ns
        first = ctx.one(
            """WITH r AS (SELECT rank, step, s, e - s AS dur,
                           row_number() OVER (PARTITION BY rank ORDER BY s) AS i FROM steps_w),
                 f AS (SELECT * FROM r WHERE i = 1),
                 m AS (SELECT rank, median(dur) AS steady FROM r WHERE i > 1 GROUP BY rank),
                 c AS (SELECT f.rank, sum(x.dur_ns) AS ns FROM f JOIN ev x
                       ON x.rank = f.rank AND x.layer = 'host' AND x.kind = 'compile'
                       AND x.id NOT IN (SELECT id FROM recompiles)
                       AND x.start_ns >= f.s AND x.start_ns < f.s + f.dur GROUP BY f.rank)
            SELECT f.rank, f.dur AS first_ns, m.steady AS steady_ns,
                   coalesce(c.ns, 0) AS first_compile_ns
            FROM f JOIN m USING (rank) LEFT JOIN c USING (rank)
            ORDER BY f.dur / m.steady DESC LIMIT 1"""
        )
        ratio = (first["first_ns"] / first["steady_ns"]) if first.get("steady_ns") else 0.0
        slow_first = ratio >= self.FIRST_STEP_RATIO and first.get("first_compile_ns", 0) > 0
        share = ns / step_ns
        if share < self.COMPILE_SHARE and not slow_first:
            return []
        steady = (
            f", first step {fmt_ms(first['first_ns'])} vs steady {fmt_ms(first['steady_ns'])}"
            if first
            else ""
        )
        return [
            self.finding(
                ctx,
                title=f"Compilation takes {fmt_ms(ns)} ({fmt_pct(share)} of step time){steady}",
                detail=(
                    f"{n} compiles took {fmt_ms(backend_ns)}"
                    + (
                        f", and torch.compile's tracing {fmt_ms(trace_ns)} more."
                        if trace_ns
                        else "."
                    )
                    + (
                        f" The first step runs {ratio:.1f}x the median of the later steps, "
                        "so the profile mostly measures compilation."
                        if first
                        else ""
                    )
                ),
                saving_ns=ns,
                evidence=Evidence(
                    event_ids=longest_ids(ctx, where),
                    ops=top_ops(ctx, where),
                    source_lines=top_lines(ctx, where),
                    metrics={
                        "compiles": n,
                        "compile_ns": backend_ns,
                        "trace_ns": trace_ns,
                        "compile_share": round(share, 4),
                        "first_step_ns": int(first.get("first_ns") or 0),
                        "steady_step_ns": float(first.get("steady_ns") or 0.0),
                    },
                ),
            )
        ]

"""compile-dominated: compilation, not steady-state steps, takes the profiled time."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..conventions import TRACE_COMPILE_PREDICATE
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct, longest_ids, top_lines, top_ops
from ..rule import torch_compile_trace_ns as trace_ns_of

# recompiles are recompilation's finding (the shared `recompiles` table)
WHERE = "layer = 'host' AND kind = 'compile' AND id NOT IN (SELECT id FROM recompiles)"
# what a warm cache removes: those compiles and torch.compile's tracing spans around them that
# hold no recompile
COMPILED = (
    f"({WHERE}) OR ({TRACE_COMPILE_PREDICATE} AND NOT EXISTS (SELECT 1 FROM recompiles r "
    "WHERE r.rank = ev.rank AND r.start_ns >= ev.start_ns "
    "AND r.start_ns + r.dur_ns <= ev.start_ns + ev.dur_ns))"
)
FIRST_STEP_SQL = """
WITH r AS (SELECT rank, step, s, e - s AS dur,
               row_number() OVER (PARTITION BY rank ORDER BY s) AS i FROM steps_w),
     f AS (SELECT * FROM r WHERE i = 1),
     m AS (SELECT rank, median(dur) AS steady FROM r WHERE i > 1 GROUP BY rank),
     c AS (SELECT f.rank, sum(x.dur_ns) AS ns FROM f JOIN ev x
           ON x.rank = f.rank AND x.layer = 'host' AND x.kind = 'compile'
           AND x.id NOT IN (SELECT id FROM recompiles)
           AND x.start_ns >= f.s AND x.start_ns < f.s + f.dur GROUP BY f.rank)
SELECT f.rank, f.dur AS first_ns, m.steady AS steady_ns, coalesce(c.ns, 0) AS first_compile_ns
FROM f JOIN m USING (rank) LEFT JOIN c USING (rank)
ORDER BY f.dur / m.steady DESC LIMIT 1"""


@dataclass(frozen=True)
class Compiles:
    compiles: int
    backend_ns: int  # in the backend's compile events
    trace_ns: int  # in torch.compile's tracing around them
    step_ns: int
    first_ns: int  # the first step of the rank where it is slowest against the rest
    steady_ns: float  # the median of that rank's other steps (0 without them)
    first_compile_ns: int  # compiling inside that first step
    has_first: bool  # some rank has a first step and later ones

    @property
    def ns(self) -> int:
        return self.backend_ns + self.trace_ns

    @property
    def first_ratio(self) -> float:
        return self.first_ns / self.steady_ns if self.steady_ns else 0.0


class CompileDominated(Rule[Compiles]):
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
    The saving is the replay of that compile and tracing time removed from the steps' host (a
    warm persistent cache or a warm-up before the measured run removes it); compiles outside
    every step shorten no step.
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

    def measure(self, ctx: AnalysisContext) -> Compiles | None:
        agg = ctx.one(f"SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns FROM ev WHERE {WHERE}")
        n, step_ns = int(agg.get("n") or 0), ctx.total_step_ns
        if n == 0 or step_ns <= 0:
            return None
        first = ctx.one(FIRST_STEP_SQL)
        return Compiles(
            compiles=n,
            backend_ns=int(agg.get("ns") or 0),
            trace_ns=trace_ns_of(ctx, around_recompiles=False),
            step_ns=step_ns,
            first_ns=int(first.get("first_ns") or 0),
            steady_ns=float(first.get("steady_ns") or 0.0),
            first_compile_ns=int(first.get("first_compile_ns") or 0),
            has_first=bool(first),
        )

    def gate(self, facts: Compiles) -> bool:
        slow_first = facts.first_ratio >= self.FIRST_STEP_RATIO and facts.first_compile_ns > 0
        return facts.ns / facts.step_ns >= self.COMPILE_SHARE or slow_first

    def evidence(self, ctx: AnalysisContext, facts: Compiles) -> Evidence:
        return Evidence(
            event_ids=longest_ids(ctx, WHERE),
            ops=top_ops(ctx, WHERE),
            source_lines=top_lines(ctx, WHERE),
            metrics={
                "compiles": facts.compiles,
                "compile_ns": facts.backend_ns,
                "trace_ns": facts.trace_ns,
                "compile_share": round(facts.ns / facts.step_ns, 4),
                "first_step_ns": facts.first_ns,
                "steady_step_ns": facts.steady_ns,
            },
        )

    def explain(self, facts: Compiles, evidence: Evidence) -> Draft:
        ns, share = facts.ns, facts.ns / facts.step_ns
        has_first = facts.has_first
        steady = (
            f", first step {fmt_ms(facts.first_ns)} vs steady {fmt_ms(facts.steady_ns)}"
            if has_first
            else ""
        )
        return Draft(
            title=f"Compilation takes {fmt_ms(ns)} ({fmt_pct(share)} of step time){steady}",
            detail=(
                f"{facts.compiles} compiles took {fmt_ms(facts.backend_ns)}"
                + (
                    f", and torch.compile's tracing {fmt_ms(facts.trace_ns)} more."
                    if facts.trace_ns
                    else "."
                )
                + (
                    f" The first step runs {facts.first_ratio:.1f}x the median of the later "
                    "steps, so the profile mostly measures compilation."
                    if has_first
                    else ""
                )
            ),
            saving_ns=ns,
            evidence=evidence,
            change=Replayed(
                f"these {facts.compiles} compiles and the tracing around them removed from the "
                "host (a warm cache)",
                COMPILED,
                "remove_host",
            ),
        )

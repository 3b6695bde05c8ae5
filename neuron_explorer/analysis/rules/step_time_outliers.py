"""step-time-outliers: some steps take much longer than the typical one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .. import intervals
from ..breakdown import host_cause_rows
from ..context import AnalysisContext
from ..findings import Evidence, Hotspot
from ..rule import Draft, Rule, fmt_ms, hotspots

HOST_WORK = "('op', 'annotation', 'python', 'sync', 'fallback')"


@dataclass(frozen=True)
class Outliers:
    steps: int  # all step windows
    outliers: tuple[dict[str, Any], ...]  # rank, step, s, dur_ns, med, comp: the worst first
    compiling: Any  # pa.Table (rank, s, e): compile time, netted out of every step
    ranked: Any  # pa.Table of the outliers (rank, step) for the evidence query

    @property
    def extra_ns(self) -> int:
        return sum(max(int(r["dur_ns"] - r["comp"] - r["med"]), 0) for r in self.outliers)


class StepTimeOutliers(Rule[Outliers]):
    """Steps much slower than the rank's median step.

    Pattern: most steps take the same time but a few are far slower (a periodic checkpoint or
    evaluation, garbage collection, a recompile, a straggling data batch).
    Algorithm: per rank with at least MIN_STEPS steps, a step is an outlier when it takes more
    than OUTLIER_RATIO times the rank's median step, both net of their compile time: compile
    events and torch.compile's tracing spans around them (compiling is compile-dominated's or
    recompilation's finding). MIN_STEPS is 3, the steps the default capture and the
    README's schedule record: the median of 3 is a normal step while only one is slow. In a job
    of several ranks each rank's first step is left out (facts.steady_w): it holds the ranks'
    start-up skew. The saving is the time above the median.
    Evidence: the outlier steps, and the host ops whose time per step is most above their mean
    over the other steps.
    """

    id = "step-time-outliers"
    title = "Step-time outliers"
    severity = "low"
    MIN_STEPS = 3  # = the default capture's active steps (capture.Schedule, README snippet)
    OUTLIER_RATIO = 1.5
    fix = (
        "Open the slow steps (evidence) and find the extra work: move checkpointing, "
        "evaluation or logging off the step path (or to a fixed, documented interval), warm up "
        "before measuring, and keep input shapes fixed."
    )

    def measure(self, ctx: AnalysisContext) -> Outliers | None:
        if not ctx.has_steps:
            return None
        # compile time per step: the union of compile events and torch.compile's own tracing
        # spans around them (a recompile's dynamo tracing is recompilation's, not an outlier)
        compiling = ctx.merge_rows(host_cause_rows(ctx)["compile"])
        windows = ctx.arrow("SELECT rank, s, s AS ws, e AS we FROM steady_w")
        comp = pa.array(intervals.covered(compiling, ["rank"], windows), pa.int64())
        per_step = windows.select(["rank", "s"]).append_column("comp", comp)
        out = ctx.arrow(
            f"""WITH c AS (SELECT * FROM step_compile),
                 -- the median of the steps net of compiling too: a step that compiles
                 -- ops first used there would otherwise raise the bar for the others
                 r AS (SELECT w.rank, median(w.e - w.s - c.comp) AS med, count(*) AS n
                       FROM steady_w w JOIN c USING (rank, s)
                       GROUP BY w.rank HAVING count(*) >= {int(self.MIN_STEPS)})
            SELECT w.rank, w.step, w.s, w.e - w.s AS dur_ns, r.med, c.comp
            FROM steady_w w JOIN r USING (rank) JOIN c USING (rank, s)
            WHERE w.e - w.s - c.comp > {float(self.OUTLIER_RATIO)} * r.med
            ORDER BY dur_ns - comp DESC, w.rank, w.s""",
            tables={"step_compile": per_step},
        )
        return Outliers(ctx.steps().num_rows, tuple(out.to_pylist()), compiling, out)

    def gate(self, facts: Outliers) -> bool:
        return bool(facts.outliers)

    def evidence(self, ctx: AnalysisContext, facts: Outliers) -> Evidence:
        """The host ops whose time per step is most above their mean over the other steps."""
        n_slow = len(facts.outliers)
        n_normal = max(facts.steps - n_slow, 1)
        culprits = ctx.rows(
            f"""WITH x AS (
                SELECT e.name, e.dur_ns, (o.step IS NOT NULL) AS slow
                FROM ev e LEFT JOIN step_outliers o ON o.rank = e.rank AND o.step = e.step
                WHERE e.layer = 'host' AND e.step IS NOT NULL AND e.kind IN {HOST_WORK}
                  -- compiling, and the spans that hold it, are netted out above
                  AND NOT EXISTS (SELECT 1 FROM step_compile_union u WHERE u.rank = e.rank
                                  AND e.start_ns < u.e AND e.start_ns + e.dur_ns > u.s))
            SELECT name AS label, count(*) FILTER (WHERE slow) AS count,
                   sum(dur_ns) FILTER (WHERE slow) / {n_slow}
                   - coalesce(sum(dur_ns) FILTER (WHERE NOT slow), 0) / {n_normal} AS dur_ns
            FROM x GROUP BY 1 HAVING dur_ns > 0 ORDER BY dur_ns DESC, label LIMIT 5""",
            tables={"step_outliers": facts.ranked, "step_compile_union": facts.compiling},
        )
        steps = tuple(
            Hotspot(
                label=f"step {r['step']} (rank {r['rank']})",
                dur_ns=int(r["dur_ns"]),
                count=1,
                note=f"median {fmt_ms(r['med'])}",
            )
            for r in facts.outliers[:10]
        )
        worst = facts.outliers[0]
        return Evidence(
            ops=hotspots(culprits) + steps,
            metrics={
                "outliers": n_slow,
                "extra_ns": facts.extra_ns,
                "worst_ns": int(worst["dur_ns"]),
                "median_ns": float(worst["med"]),
            },
        )

    def explain(self, facts: Outliers, evidence: Evidence) -> Draft:
        out, worst = facts.outliers, facts.outliers[0]
        compiled = f", after {fmt_ms(worst['comp'])} of compiling" if worst["comp"] else ""
        return Draft(
            title=f"{len(out)} step(s) take over {self.OUTLIER_RATIO}x the median step "
            f"(worst {fmt_ms(worst['dur_ns'] - worst['comp'])} vs {fmt_ms(worst['med'])}"
            f"{compiled})",
            detail=(
                f"{len(out)} steps run {fmt_ms(facts.extra_ns)} longer in all than the median "
                "step of their rank. The ops listed take more time in those steps than usual."
            ),
            saving_ns=facts.extra_ns,
            evidence=evidence,
        )

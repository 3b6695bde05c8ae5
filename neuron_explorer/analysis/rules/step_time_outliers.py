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
WORK_KINDS = "('op', 'annotation', 'python', 'sync', 'fallback', 'copy')"  # a step's recorded work

BOUND = (
    "the slow steps' time above the median that their extra work accounts for; not replayed: "
    "the extra calls are counted by name against a normal step, not picked out one by one"
)


@dataclass(frozen=True)
class Outliers:
    steps: int  # all step windows
    # rank, step, s, dur_ns, med, comp, extra_work_ns: the worst first
    outliers: tuple[dict[str, Any], ...]
    compiling: Any  # pa.Table (rank, s, e): compile time, netted out of every step
    ranked: Any  # pa.Table of the outliers (rank, step) for the evidence query

    @property
    def extra_ns(self) -> int:
        """The time above the median that the slow steps' extra work accounts for."""
        return sum(min(_excess(r), int(r["extra_work_ns"])) for r in self.outliers)


def _excess(r: dict[str, Any]) -> int:
    return max(int(r["dur_ns"] - r["comp"] - r["med"]), 0)


class StepTimeOutliers(Rule[Outliers]):
    """Steps much slower than the rank's median step.

    Pattern: most steps take the same time but a few are far slower (a periodic checkpoint or
    evaluation, garbage collection, a recompile, a straggling data batch).
    Algorithm: per rank with at least MIN_STEPS steps, a step is an outlier when it takes more
    than OUTLIER_RATIO times the rank's median step, both net of their compile time: compile
    events and torch.compile's tracing spans around them (compiling is compile-dominated's or
    recompilation's finding). MIN_STEPS is 3, the steps the default capture and the
    README's schedule record: the median of 3 is a normal step while only one is slow. A slow
    step must also run recorded work the normal steps do not: per event name (host ops,
    annotations, syncs, fallbacks, copies, outside compiling), the calls beyond those of the
    most similar normal step, with their share of the name's time; that extra work must account
    for at least MIN_EXPLAINED_SHARE of the time above the median. A step that runs the same
    work as the others, only slower, is the host's noise (another process, the OS), with
    nothing in the script to change. In a job of several ranks each rank's first step is
    left out (facts.steady_w): it holds the ranks' start-up skew. The saving is the time above
    the median that the extra work accounts for.
    Evidence: the outlier steps, and the host ops whose time per step is most above their mean
    over the other steps.
    """

    id = "step-time-outliers"
    title = "Step-time outliers"
    severity = "low"
    MIN_STEPS = 3  # = the default capture's active steps (capture.Schedule, README snippet)
    OUTLIER_RATIO = 1.5
    MIN_EXPLAINED_SHARE = 0.5
    fix = (
        "The slow steps run work the other steps do not (evidence: the ops with extra calls "
        "or time there): run it less often or off the step path, or, if it is first-use work, "
        "warm up before measuring; keep input shapes fixed."
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
        rows = _with_extra_work(ctx, out.to_pylist(), compiling)
        kept = [r for r in rows if r["extra_work_ns"] >= self.MIN_EXPLAINED_SHARE * _excess(r)]
        keys = {(r["rank"], r["s"]) for r in kept}
        ranked = out.filter(
            pa.array([(r, s) in keys for r, s in zip(out["rank"].to_pylist(),
                                                        out["s"].to_pylist(), strict=True)],
                     pa.bool_())
        )  # fmt: skip
        return Outliers(ctx.steps().num_rows, tuple(kept), compiling, ranked)

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
                f"{len(out)} steps run {fmt_ms(sum(_excess(r) for r in out))} longer in all "
                "than the median step of their rank; the work they run beyond the other steps "
                f"accounts for {fmt_ms(facts.extra_ns)}. The ops listed take more time in those "
                "steps than usual."
            ),
            saving_ns=facts.extra_ns,
            bound=BOUND,
            evidence=evidence,
        )


def _with_extra_work(
    ctx: AnalysisContext, candidates: list[dict[str, Any]], compiling: Any
) -> list[dict[str, Any]]:
    """Each slow step with extra_work_ns: the time of its recorded calls beyond those of the
    most similar other step of its rank (per event name, the extra calls' share of the name's
    time), compiling left out."""
    if not candidates:
        return []
    ranks = sorted({int(r["rank"]) for r in candidates})
    work = ctx.rows(
        f"""SELECT e.rank, e.step, e.name, count(*) AS n, sum(e.dur_ns) AS ns
        FROM ev e WHERE e.layer = 'host' AND e.step IS NOT NULL AND e.kind IN {WORK_KINDS}
          AND e.rank IN ({", ".join(map(str, ranks))})
          AND NOT EXISTS (SELECT 1 FROM step_compile_union u WHERE u.rank = e.rank
                          AND e.start_ns < u.e AND e.start_ns + e.dur_ns > u.s)
        GROUP BY ALL""",
        tables={"step_compile_union": compiling},
    )
    steps: dict[tuple[int, int], dict[str, tuple[int, int]]] = {}
    for w in work:
        steps.setdefault((int(w["rank"]), int(w["step"])), {})[str(w["name"])] = (
            int(w["n"]), int(w["ns"]))  # fmt: skip
    slow = {(int(r["rank"]), int(r["step"])) for r in candidates}
    out = []
    for r in candidates:
        mine = steps.get((int(r["rank"]), int(r["step"])), {})
        others = [v for k, v in steps.items() if k[0] == int(r["rank"]) and k not in slow]
        extra = min((_extra_ns(mine, o) for o in others), default=0)
        out.append({**r, "extra_work_ns": extra})
    return out


def _extra_ns(slow: dict[str, tuple[int, int]], normal: dict[str, tuple[int, int]]) -> int:
    total = 0
    for name, (n, ns) in slow.items():
        more = n - normal.get(name, (0, 0))[0]
        if more > 0:
            total += ns * more // n
    return total

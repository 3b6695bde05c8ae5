"""unfused-optimizer: the optimizer updates parameters one by one."""

from __future__ import annotations

from ..context import AnalysisContext
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, hotspots, register


@register
class UnfusedOptimizer(Rule):
    """An optimizer step made of many per-parameter ops.

    Pattern: torch.optim with foreach=False (or a hand-written update loop) issues a few ops
    per parameter, so optimizer.step() costs thousands of small launches; the multi-tensor
    (_foreach_) and fused implementations do the same work in a handful.
    Algorithm: for each host span named "Optimizer.step#..." (torch.optim's record_function),
    count the host ops on the same rank and thread that start inside it. A span is unfused when
    it holds at least MIN_OPS_PER_STEP ops and none is a _foreach_/_fused_ op. The saving
    assumed is FUSED_SAVING of the unfused optimizer steps' time.
    """

    id = "unfused-optimizer"
    title = "Optimizer updates parameters one by one"
    severity = "low"
    MIN_OPS_PER_STEP = 32  # a few ops per parameter for a model of 16+ parameters
    FUSED_SAVING = 0.5  # multi-tensor/fused optimizers typically halve optimizer.step()
    fix = (
        "Use the multi-tensor or fused implementation: torch.optim.AdamW(params, lr, "
        "foreach=True) or fused=True (GPU), and avoid per-parameter Python loops around "
        "optimizer.step(); on the neuron device torch.compile the optimizer step."
    )

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        opt = "layer = 'host' AND kind <> 'step' AND is_optimizer"
        if not ctx.one(f"SELECT count(*) AS n FROM ev WHERE {opt}").get("n"):
            return []
        fused = "x.is_fused"
        # each host op finds the optimizer span around it on its thread: by hash join within
        # the same step when steps are known, else by an ASOF join (the latest span that
        # started before the op); it counts when it also starts before that span ends
        if ctx.has_steps:
            join = "x JOIN o ON x.rank = o.rank AND x.track = o.track AND x.step = o.step"
            join += " AND x.start_ns >= o.start_ns"
        else:
            join = "x ASOF JOIN o ON x.rank = o.rank AND x.track = o.track"
            join += " AND x.start_ns >= o.start_ns"
        ctx.run(
            f"""CREATE OR REPLACE TEMP TABLE opt_ops AS
            WITH o AS (SELECT id, rank, track, step, start_ns, start_ns + dur_ns AS end_ns
                       FROM ev WHERE {opt}),
                 x AS (SELECT id, rank, track, step, name, start_ns, dur_ns, is_fused FROM ev
                       WHERE layer = 'host' AND kind = 'op')
            SELECT o.id AS oid, x.id, x.name, x.dur_ns, {fused} AS fused
            FROM {join}
            WHERE x.start_ns < o.end_ns"""
        )
        ctx.run(
            f"""CREATE OR REPLACE TEMP TABLE opt_steps AS
            SELECT o.id, o.name, o.dur_ns, count(x.id) AS ops,
                   count(x.id) FILTER (WHERE x.fused) AS fused
            FROM (SELECT * FROM ev WHERE {opt}) o LEFT JOIN opt_ops x ON x.oid = o.id
            GROUP BY o.id, o.name, o.dur_ns"""
        )
        rows = ctx.rows(
            f"""SELECT name AS label, count(*) AS count, sum(dur_ns) AS dur_ns,
                   sum(ops) AS ops, min(ops) AS min_ops FROM opt_steps
            WHERE ops >= {int(self.MIN_OPS_PER_STEP)} AND fused = 0 GROUP BY name"""
        )
        if not rows:
            return []
        ns = sum(int(r["dur_ns"]) for r in rows)
        spans = sum(int(r["count"]) for r in rows)
        ops = sum(int(r["ops"]) for r in rows)
        top = hotspots(
            ctx.rows(
                """SELECT x.name AS label, count(*) AS count, sum(x.dur_ns) AS dur_ns
                FROM opt_ops x JOIN opt_steps s ON s.id = x.oid
                WHERE s.fused = 0 GROUP BY 1 ORDER BY count DESC, label LIMIT 5"""
            )
        )
        ids = tuple(
            int(r[0])
            for r in ctx.con.execute(
                "SELECT id FROM opt_steps WHERE fused = 0 ORDER BY dur_ns DESC LIMIT 20"
            ).fetchall()
        )
        return [
            self.finding(
                ctx,
                title=f"{spans} optimizer step(s) run ~{ops // spans} ops each, "
                f"{fmt_ms(ns)} in all",
                detail=(
                    f"Each of {spans} optimizer.step() calls runs about {ops // spans} separate "
                    "host ops (a few per parameter) and no multi-tensor (_foreach_) or fused "
                    "op, so dispatch overhead dominates the update."
                ),
                saving_ns=ns * self.FUSED_SAVING,
                evidence=Evidence(
                    event_ids=ids,
                    ops=top,
                    metrics={"optimizer_steps": spans, "ops": ops, "optimizer_ns": ns},
                ),
            )
        ]

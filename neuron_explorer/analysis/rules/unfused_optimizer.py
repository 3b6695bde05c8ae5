"""unfused-optimizer: the optimizer updates parameters one by one."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..facts import OPTIMIZER_MIN_OPS_PER_STEP
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, hotspots, ids_of


@dataclass(frozen=True)
class Unfused:
    """The unfused optimizer steps (the shared `optimizer_steps`), summed."""

    spans: int
    ops: int
    ns: int


class UnfusedOptimizer(Rule[Unfused]):
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
    MIN_OPS_PER_STEP = OPTIMIZER_MIN_OPS_PER_STEP  # a few ops per parameter, 16+ parameters
    FUSED_SAVING = 0.5  # multi-tensor/fused optimizers typically halve optimizer.step()
    fix = (
        "Use the multi-tensor or fused implementation: torch.optim.AdamW(params, lr, "
        "foreach=True) or fused=True (GPU), and avoid per-parameter Python loops around "
        "optimizer.step(); on the neuron device torch.compile the optimizer step."
    )

    def measure(self, ctx: AnalysisContext) -> Unfused:
        row = ctx.one(
            f"""SELECT count(*) AS spans, coalesce(sum(ops), 0) AS ops,
                   coalesce(sum(dur_ns), 0) AS ns FROM optimizer_steps
            WHERE ops >= {int(self.MIN_OPS_PER_STEP)} AND fused = 0"""
        )
        return Unfused(int(row["spans"]), int(row["ops"]), int(row["ns"]))

    def gate(self, facts: Unfused) -> bool:
        return facts.spans > 0

    def evidence(self, ctx: AnalysisContext, facts: Unfused) -> Evidence:
        top = hotspots(
            ctx.rows(
                """SELECT x.name AS label, count(*) AS count, sum(x.dur_ns) AS dur_ns
                FROM optimizer_ops x JOIN optimizer_steps s ON s.id = x.oid
                WHERE s.fused = 0 GROUP BY 1 ORDER BY count DESC, label LIMIT 5"""
            )
        )
        ids = ids_of(
            ctx, "SELECT id FROM optimizer_steps WHERE fused = 0 ORDER BY dur_ns DESC, id LIMIT 20"
        )
        return Evidence(
            event_ids=ids,
            ops=top,
            metrics={"optimizer_steps": facts.spans, "ops": facts.ops, "optimizer_ns": facts.ns},
        )

    def explain(self, facts: Unfused, evidence: Evidence) -> Draft:
        spans, ops, ns = facts.spans, facts.ops, facts.ns
        return Draft(
            title=f"{spans} optimizer step(s) run ~{ops // spans} ops each, {fmt_ms(ns)} in all",
            detail=(
                f"Each of {spans} optimizer.step() calls runs about {ops // spans} separate "
                "host ops (a few per parameter) and no multi-tensor (_foreach_) or fused "
                "op, so dispatch overhead dominates the update."
            ),
            saving_ns=ns * self.FUSED_SAVING,
            evidence=evidence,
            change=Replayed(
                f"the optimizer steps' host time cut by {self.FUSED_SAVING:.0%} (their "
                f"~{ops // spans} ops each fused into a few multi-tensor launches)",
                f"id IN (SELECT id FROM optimizer_steps WHERE ops >= {int(self.MIN_OPS_PER_STEP)}"
                " AND fused = 0)",
                "remove_host",
                factor=self.FUSED_SAVING,
            ),  # fmt: skip
        )

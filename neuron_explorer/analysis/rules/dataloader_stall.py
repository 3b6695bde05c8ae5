"""dataloader-stall: the step waits for the next batch."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct, longest_ids, top_lines, top_ops

WHERE = "layer = 'host' AND kind IN ('annotation', 'op') AND is_loader"


@dataclass(frozen=True)
class Loading:
    loader_ns: int  # in the DataLoader's __next__ inside steps
    between_steps_ns: int
    step_ns: int

    @property
    def stall_ns(self) -> int:
        return self.loader_ns + self.between_steps_ns

    @property
    def share(self) -> float:
        denom = self.step_ns + self.between_steps_ns
        return self.stall_ns / denom if denom > 0 else 0.0


class DataloaderStall(Rule[Loading]):
    """Time spent fetching batches instead of training.

    Pattern: the training process loads and collates batches itself (num_workers=0) or the
    workers cannot keep up, so each step starts with the host in DataLoader.__next__, or steps
    are separated by gaps where no ProfilerStep runs.
    Algorithm: merge the host spans named like the DataLoader's __next__ (torch.profiler's
    "enumerate(DataLoader)#...__next__", conventions.DATALOADER_LIKE) per rank and clip them to
    the step windows; add the
    gaps between consecutive steps of a rank. Report when that time is at least MIN_SHARE of
    step time (plus gaps). The saving is a replay of the batches ready when asked for: the
    loader spans' host time in the steps removed; the gaps between steps are no step's time,
    so the detail gives them apart and the saving leaves them out.
    """

    id = "dataloader-stall"
    title = "Data loading stalls the steps"
    severity = "medium"
    MIN_SHARE = 0.10
    fix = (
        "Load batches in parallel with the step: DataLoader(..., num_workers=4, "
        "pin_memory=True, persistent_workers=True, prefetch_factor=2), and move per-sample "
        "preprocessing out of __getitem__ or onto the device."
    )

    def measure(self, ctx: AnalysisContext) -> Loading | None:
        if not ctx.has_steps:
            return None
        spans = ctx.merge(
            f"SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM ev WHERE {WHERE}"
        )
        row = ctx.one(
            """SELECT coalesce(sum(least(m.e, w.e) - greatest(m.s, w.s)), 0) AS ns
            FROM loader_spans m JOIN steps_w w ON w.rank = m.rank AND m.s < w.e AND m.e > w.s""",
            tables={"loader_spans": spans},
        )
        gap = ctx.one(
            """SELECT coalesce(sum(greatest(nxt - e, 0)), 0) AS ns FROM
            (SELECT e, lead(s) OVER (PARTITION BY rank ORDER BY s) AS nxt FROM steps_w)
            WHERE nxt IS NOT NULL"""
        )
        return Loading(int(row.get("ns") or 0), int(gap.get("ns") or 0), ctx.total_step_ns)

    def gate(self, facts: Loading) -> bool:
        denom = facts.step_ns + facts.between_steps_ns
        return denom > 0 and facts.stall_ns >= self.MIN_SHARE * denom

    def evidence(self, ctx: AnalysisContext, facts: Loading) -> Evidence:
        return Evidence(
            event_ids=longest_ids(ctx, WHERE),
            ops=top_ops(ctx, WHERE),
            source_lines=top_lines(ctx, WHERE),
            metrics={
                "loader_ns": facts.loader_ns,
                "between_steps_ns": facts.between_steps_ns,
                "share": round(facts.share, 4),
            },
        )

    def explain(self, facts: Loading, evidence: Evidence) -> Draft:
        return Draft(
            title=f"Data loading takes {fmt_pct(facts.share)} of the step time",
            detail=(
                f"The host spent {fmt_ms(facts.loader_ns)} inside the DataLoader's __next__ "
                f"within steps and {fmt_ms(facts.between_steps_ns)} between steps, "
                f"{fmt_ms(facts.stall_ns)} in all, while the model waited for its next batch."
                + (
                    " The time between steps is outside every step: the saving, a replay of "
                    "the steps, leaves it out, though the run would end that much sooner too."
                    if facts.between_steps_ns
                    else ""
                )
            ),
            saving_ns=facts.stall_ns,
            evidence=evidence,
            change=Replayed(
                "the DataLoader's __next__ removed from the steps' host time (each batch ready "
                "when asked for)",
                WHERE,
                "remove_host",
            ),
        )

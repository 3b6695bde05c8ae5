"""dataloader-stall: the step waits for the next batch."""

from __future__ import annotations

from ..context import AnalysisContext
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, fmt_pct, longest_ids, register, top_lines, top_ops


@register
class DataloaderStall(Rule):
    """Time spent fetching batches instead of training.

    Pattern: the training process loads and collates batches itself (num_workers=0) or the
    workers cannot keep up, so each step starts with the host in DataLoader.__next__, or steps
    are separated by gaps where no ProfilerStep runs.
    Algorithm: merge the host spans named like the DataLoader's __next__ (torch.profiler's
    "enumerate(DataLoader)#...__next__", conventions.DATALOADER_LIKE) per rank and clip them to
    the step windows; add the
    gaps between consecutive steps of a rank. Report when that time is at least MIN_SHARE of
    step time (plus gaps).
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

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        if not ctx.has_steps:
            return []
        where = "layer = 'host' AND kind IN ('annotation', 'op') AND is_loader"
        src = f"SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM ev WHERE {where}"
        ctx.merged("loader_spans", src)
        row = ctx.one(
            """SELECT coalesce(sum(least(m.e, w.e) - greatest(m.s, w.s)), 0) AS ns
            FROM loader_spans m JOIN steps_w w ON w.rank = m.rank AND m.s < w.e AND m.e > w.s"""
        )
        loader_ns = int(row.get("ns") or 0)
        gap = ctx.one(
            """SELECT coalesce(sum(greatest(nxt - e, 0)), 0) AS ns FROM
            (SELECT e, lead(s) OVER (PARTITION BY rank ORDER BY s) AS nxt FROM steps_w)
            WHERE nxt IS NOT NULL"""
        )
        gap_ns = int(gap.get("ns") or 0)
        stall = loader_ns + gap_ns
        denom = ctx.total_step_ns + gap_ns
        if denom <= 0 or stall < self.MIN_SHARE * denom:
            return []
        share = stall / denom
        return [
            self.finding(
                ctx,
                title=f"Data loading takes {fmt_pct(share)} of the step time",
                detail=(
                    f"The host spent {fmt_ms(loader_ns)} inside the DataLoader's __next__ within "
                    f"steps and {fmt_ms(gap_ns)} between steps, {fmt_ms(stall)} in all, while "
                    "the model waited for its next batch."
                ),
                saving_ns=stall,
                evidence=Evidence(
                    event_ids=longest_ids(ctx, where),
                    ops=top_ops(ctx, where),
                    source_lines=top_lines(ctx, where),
                    metrics={
                        "loader_ns": loader_ns,
                        "between_steps_ns": gap_ns,
                        "share": round(share, 4),
                    },
                ),
            )
        ]

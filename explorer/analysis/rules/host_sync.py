"""host-sync: the step reads values back from the device (.item(), .cpu(), print)."""

from __future__ import annotations

from ..context import AnalysisContext
from ..conventions import NEURON_SYNC_KIND
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, fmt_pct, hotspots, longest_ids, register, top_lines


@register
class HostSync(Rule):
    """Host syncs inside the step on the neuron device.

    Pattern: .item(), .cpu(), .tolist() or printing a device tensor inside the training step
    makes the host wait until the device has finished all queued work, so host and device stop
    overlapping.
    Algorithm: the host events of kind sync (args.reason: item | cpu | print | synchronize;
    dur_ns is the wait). Report when there are at least MIN_SYNCS of them waiting at least
    MIN_SHARE of step time; the saving is the wait time.
    """

    id = "host-sync"
    title = "Host syncs inside the step"
    severity = "medium"
    scope = "neuron"
    MIN_SYNCS = 1
    MIN_SHARE = 0.02
    fix = (
        "Keep values on the device inside the step: accumulate the loss in a device tensor and "
        "call .item() every N steps, log outside the step, and drop print(tensor) from the loop."
    )

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        where = f"layer = 'host' AND kind = '{NEURON_SYNC_KIND}'"
        agg = ctx.one(f"SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns FROM ev WHERE {where}")
        n, ns = int(agg.get("n") or 0), int(agg.get("ns") or 0)
        step_ns = ctx.total_step_ns
        if n < self.MIN_SYNCS or step_ns <= 0 or ns < self.MIN_SHARE * step_ns:
            return []
        reasons = hotspots(
            ctx.rows(
                f"""SELECT coalesce(json_extract_string(args, '$.reason'), name) AS label,
                       sum(dur_ns) AS dur_ns, count(*) AS count FROM ev WHERE {where}
                GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5"""
            )
        )
        return [
            self.finding(
                ctx,
                title=f"{n} host sync(s) wait {fmt_ms(ns)} ({fmt_pct(ns / step_ns)} of step "
                f"time): {', '.join(r.label for r in reasons[:3])}",
                detail=(
                    f"The host waited {fmt_ms(ns)} for the device in {n} syncs inside the "
                    "steps. Each sync drains the device's queue, so the host cannot run ahead "
                    "and the device then idles while the host prepares the next work."
                ),
                saving_ns=ns,
                evidence=Evidence(
                    event_ids=longest_ids(ctx, where),
                    ops=reasons,
                    source_lines=top_lines(ctx, where),
                    metrics={"syncs": n, "sync_ns": ns, "share": round(ns / step_ns, 4)},
                ),
            )
        ]

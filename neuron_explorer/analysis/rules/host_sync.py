"""host-sync: the step reads values back from the device (.item(), .cpu(), print)."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..conventions import NEURON_SYNC_KIND
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct, hotspots, longest_ids, top_lines

# a fallback's own wait for the device belongs to cpu-fallback
WHERE = (
    f"layer = 'host' AND kind = '{NEURON_SYNC_KIND}' AND NOT (name = 'sync' AND op_name "
    "IN (SELECT op_name FROM ev WHERE kind = 'fallback'))"
)


@dataclass(frozen=True)
class Syncs:
    syncs: int
    wait_ns: int
    steps_with_syncs: int
    steps: int  # ProfilerStep windows (0 without steps)
    step_ns: int


class HostSync(Rule[Syncs]):
    """Host syncs inside the step on the neuron device.

    Pattern: .item(), .cpu(), .tolist() or printing a device tensor inside the training step
    makes the host wait until the device has finished all queued work, so host and device stop
    overlapping.
    Algorithm: the host events of kind sync (args.reason: item | cpu | print | synchronize;
    dur_ns is the wait), except a CPU fallback's own wait. Report when there are at least
    MIN_SYNCS of them and they wait at least MIN_SHARE of step time or occur in at least
    EVERY_STEP_FRACTION of the steps (a sync in every step is cheap while the step is
    launch-bound and costly once it is not); the saving is the replayed steps' drop with them
    removed (less than the wait when the device outlasts the host anyway).
    Category: performance, ranked by that saving like any other. A sync does not stop the
    model from running right on the device (readiness is for fallbacks, float64 numerics and
    unsupported areas); what a per-step sync does block is graph capture: `.item()` ends a
    torch.compile graph there (a graph break), so the detail says so when the syncs happen in
    EVERY_STEP_FRACTION of the steps.
    """

    id = "host-sync"
    title = "Host syncs inside the step"
    severity = "medium"
    scope = "neuron"
    MIN_SYNCS = 1
    MIN_SHARE = 0.02
    EVERY_STEP_FRACTION = 0.5  # syncs in this share of steps are reported whatever they cost
    fix = (
        "Keep values on the device inside the step: accumulate the loss in a device tensor and "
        "call .item() every N steps, log outside the step, and drop print(tensor) from the loop."
    )

    def measure(self, ctx: AnalysisContext) -> Syncs:
        agg = ctx.one(
            f"""SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns,
                   count(DISTINCT step) AS steps FROM ev WHERE {WHERE}"""
        )
        return Syncs(
            syncs=int(agg.get("n") or 0),
            wait_ns=int(agg.get("ns") or 0),
            steps_with_syncs=int(agg.get("steps") or 0),
            steps=ctx.steps().num_rows if ctx.has_steps else 0,
            step_ns=ctx.total_step_ns,
        )

    def every_step(self, facts: Syncs) -> bool:
        return facts.steps > 0 and facts.steps_with_syncs >= self.EVERY_STEP_FRACTION * facts.steps

    def gate(self, facts: Syncs) -> bool:
        if facts.syncs < self.MIN_SYNCS or facts.step_ns <= 0:
            return False
        return facts.wait_ns >= self.MIN_SHARE * facts.step_ns or self.every_step(facts)

    def evidence(self, ctx: AnalysisContext, facts: Syncs) -> Evidence:
        reasons = hotspots(
            ctx.rows(
                f"""SELECT coalesce(json_extract_string(args, '$.reason'), name) AS label,
                       sum(dur_ns) AS dur_ns, count(*) AS count FROM ev WHERE {WHERE}
                GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5"""
            )
        )
        share = round(facts.wait_ns / facts.step_ns, 4)
        return Evidence(
            event_ids=longest_ids(ctx, WHERE),
            ops=reasons,
            source_lines=top_lines(ctx, WHERE),
            metrics={"syncs": facts.syncs, "sync_ns": facts.wait_ns, "share": share},
        )

    def explain(self, facts: Syncs, evidence: Evidence) -> Draft:
        n, ns = facts.syncs, facts.wait_ns
        reasons = ", ".join(r.label for r in evidence.ops[:3])
        return Draft(
            title=f"{n} host sync(s) wait {fmt_ms(ns)} ({fmt_pct(ns / facts.step_ns)} of step "
            f"time): {reasons}",
            detail=(
                f"The host waited {fmt_ms(ns)} for the device in {n} syncs inside the "
                "steps. Each sync drains the device's queue, so the host cannot run ahead "
                "and the device then idles while the host prepares the next work."
                + (
                    " A sync in (nearly) every step also blocks graph capture: under "
                    "torch.compile, .item() is a graph break, so the step compiles into "
                    "pieces with a host round trip between them. The wait is small while "
                    "the step is launch-bound and grows once it is fused."
                    if self.every_step(facts)
                    else ""
                )
            ),
            saving_ns=ns,
            evidence=evidence,
            change=Replayed(f"these {n} syncs removed", WHERE, "drop_syncs"),
        )

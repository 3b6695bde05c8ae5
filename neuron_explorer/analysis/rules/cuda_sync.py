"""cuda-sync: runtime calls that block the host until the GPU is done."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..conventions import SYNC_RUNTIME_NAMES, sql_list
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct, hotspots, longest_ids, top_lines

WHERE = f"layer = 'host' AND kind = 'runtime' AND name IN {sql_list(SYNC_RUNTIME_NAMES)}"


@dataclass(frozen=True)
class Syncs:
    calls: int
    wait_ns: int
    step_ns: int


class CudaSync(Rule[Syncs]):
    """Synchronizing CUDA/HIP runtime calls on the host.

    Pattern: cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize or a blocking
    cudaMemcpy (from .item(), .cpu(), .tolist(), printing a tensor, or explicit
    torch.cuda.synchronize()) stop the host until the device drains, so the host cannot queue
    work ahead and the device idles after each sync.
    Algorithm: sum the durations of host runtime events whose names are blocking calls
    (conventions.SYNC_RUNTIME_NAMES); report when there are at least MIN_CALLS of them taking at
    least MIN_SHARE of step time. Evidence: the framework ops that issued them and their lines.
    """

    id = "cuda-sync"
    title = "Synchronizing CUDA calls block the host"
    severity = "medium"
    MIN_CALLS = 1
    MIN_SHARE = 0.01
    fix = (
        "Remove the syncs from the step: keep losses and metrics on the device and read them "
        "every N steps, use non_blocking=True copies from pinned memory, and drop explicit "
        "torch.cuda.synchronize() outside of timing code."
    )

    def measure(self, ctx: AnalysisContext) -> Syncs:
        runtime = ctx.events_of(("runtime",), "host")
        agg = ctx.one(
            f"SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns FROM {runtime} WHERE {WHERE}"
        )
        n, ns = int(agg.get("n") or 0), int(agg.get("ns") or 0)
        return Syncs(n, ns, ctx.total_step_ns)

    def gate(self, facts: Syncs) -> bool:
        return (
            facts.calls >= self.MIN_CALLS
            and facts.step_ns > 0
            and facts.wait_ns >= self.MIN_SHARE * facts.step_ns
        )

    def evidence(self, ctx: AnalysisContext, facts: Syncs) -> Evidence:
        calls = hotspots(
            ctx.rows(
                f"""SELECT name || coalesce(' from ' || op_name, '') AS label,
                       sum(dur_ns) AS dur_ns, count(*) AS count
                FROM {ctx.events_of(("runtime",), "host")}
                WHERE {WHERE} GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5"""
            )
        )
        share = round(facts.wait_ns / facts.step_ns, 4)
        return Evidence(
            event_ids=longest_ids(ctx, WHERE),
            ops=calls,
            source_lines=top_lines(ctx, WHERE),
            metrics={"calls": facts.calls, "sync_ns": facts.wait_ns, "share": share},
        )

    def explain(self, facts: Syncs, evidence: Evidence) -> Draft:
        n, ns = facts.calls, facts.wait_ns
        return Draft(
            title=f"{n} synchronizing runtime calls wait {fmt_ms(ns)} "
            f"({fmt_pct(ns / facts.step_ns)} of step time)",
            detail=(
                f"The host waited {fmt_ms(ns)} in {n} blocking runtime calls. While it "
                "waits it cannot launch the next kernels, so the device idles after each one."
            ),
            saving_ns=ns,
            evidence=evidence,
            change=Replayed(f"these {n} synchronizing calls removed", WHERE, "drop_syncs"),
        )

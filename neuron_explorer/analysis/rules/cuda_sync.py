"""cuda-sync: runtime calls that block the host until the GPU is done."""

from __future__ import annotations

from ..context import AnalysisContext
from ..conventions import SYNC_RUNTIME_NAMES, sql_list
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, fmt_pct, hotspots, longest_ids, register, top_lines


@register
class CudaSync(Rule):
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

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        where = f"layer = 'host' AND kind = 'runtime' AND name IN {sql_list(SYNC_RUNTIME_NAMES)}"
        runtime = ctx.events_of(("runtime",), "host")
        agg = ctx.one(
            f"SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns FROM {runtime} WHERE {where}"
        )
        n, ns = int(agg.get("n") or 0), int(agg.get("ns") or 0)
        step_ns = ctx.total_step_ns
        if n < self.MIN_CALLS or step_ns <= 0 or ns < self.MIN_SHARE * step_ns:
            return []
        calls = hotspots(
            ctx.rows(
                f"""SELECT name || coalesce(' from ' || op_name, '') AS label,
                       sum(dur_ns) AS dur_ns, count(*) AS count FROM {runtime} WHERE {where}
                GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5"""
            )
        )
        return [
            self.finding(
                ctx,
                title=f"{n} synchronizing runtime calls wait {fmt_ms(ns)} "
                f"({fmt_pct(ns / step_ns)} of step time)",
                detail=(
                    f"The host waited {fmt_ms(ns)} in {n} blocking runtime calls. While it "
                    "waits it cannot launch the next kernels, so the device idles after each one."
                ),
                saving_ns=ns,
                evidence=Evidence(
                    event_ids=longest_ids(ctx, where),
                    ops=calls,
                    source_lines=top_lines(ctx, where),
                    metrics={"calls": n, "sync_ns": ns, "share": round(ns / step_ns, 4)},
                ),
            )
        ]

"""small-dma: many DMA transfers too small to use the DMA engines' bandwidth."""

from __future__ import annotations

from ..context import AnalysisContext
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, fmt_pct, longest_ids, register, top_lines, top_ops

DMA = "layer = 'device' AND kind = 'dma'"
SIZE = "coalesce(bytes_written, bytes_read, 0)"


@register
class SmallDma(Rule):
    """DMA transfers under the efficient size.

    Pattern: each DMA pays a fixed setup cost; transfers under a few KiB (per-element indexing,
    tiny tensors, non-contiguous slices moved piece by piece) run far below the DMA bandwidth.
    Algorithm: device events of kind dma, sized by bytes_written (else bytes_read). Transfers
    under the spec's dma_min_efficient_bytes (SMALL_DMA_BYTES without a spec) are small; report
    when there are at least MIN_COUNT of them and they are at least MIN_SMALL_SHARE of all
    transfers. The saving is their time minus the time their bytes take at full bandwidth.
    """

    id = "small-dma"
    title = "Small DMA transfers"
    severity = "low"
    scope = "neuron"
    SMALL_DMA_BYTES = 4096
    MIN_COUNT = 16
    MIN_SMALL_SHARE = 0.30
    fix = (
        "Move data in larger pieces: batch small tensors into one (torch.cat/stack) before "
        "moving them, make slices contiguous, and avoid per-element indexing on the device."
    )

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        spec = ctx.device_spec
        limit = int(spec.get("dma_min_efficient_bytes") or self.SMALL_DMA_BYTES)
        bw = float(spec.get("dma_bytes_per_s") or spec.get("hbm_bytes_per_s") or 0.0)
        small = f"{DMA} AND {SIZE} < {limit}"
        agg = ctx.one(
            f"""SELECT count(*) AS n, count(*) FILTER (WHERE {SIZE} < {limit}) AS small,
                   coalesce(sum(dur_ns) FILTER (WHERE {SIZE} < {limit}), 0) AS ns,
                   coalesce(sum({SIZE}) FILTER (WHERE {SIZE} < {limit}), 0) AS bytes
            FROM {ctx.events_of(("dma",), "device")} WHERE {DMA}"""
        )
        n, k = int(agg.get("n") or 0), int(agg.get("small") or 0)
        if k < self.MIN_COUNT or k < self.MIN_SMALL_SHARE * n:
            return []
        ns, nbytes = int(agg["ns"]), int(agg["bytes"])
        ideal = nbytes / bw * 1e9 if bw > 0 else 0.0
        return [
            self.finding(
                ctx,
                title=f"{k} DMA transfers under {limit} bytes ({fmt_pct(k / n)} of transfers, "
                f"{fmt_ms(ns)})",
                detail=(
                    f"{k} of {n} DMA transfers move less than {limit} bytes (mean "
                    f"{nbytes / k:.0f} B), taking {fmt_ms(ns)}; at full bandwidth their bytes "
                    f"would take {fmt_ms(ideal)}."
                ),
                saving_ns=ns - ideal,
                evidence=Evidence(
                    event_ids=longest_ids(ctx, small),
                    ops=top_ops(ctx, small),
                    source_lines=top_lines(ctx, small),
                    metrics={
                        "small_transfers": k,
                        "transfers": n,
                        "small_dma_ns": ns,
                        "small_bytes": nbytes,
                        "limit_bytes": limit,
                    },
                ),
            )
        ]

"""small-dma: many DMA transfers too small to use the DMA engines' bandwidth."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..findings import Evidence
from ..rule import Draft, Rule, fmt_ms, fmt_pct, longest_ids, top_lines, top_ops

DMA = "layer = 'device' AND kind = 'dma'"
SIZE = "coalesce(bytes_written, bytes_read, 0)"


@dataclass(frozen=True)
class Transfers:
    transfers: int
    small: int  # under limit_bytes
    small_ns: int
    small_bytes: int
    limit_bytes: int
    bytes_per_s: float  # the DMA bandwidth (0 without a spec)

    @property
    def where(self) -> str:
        return f"{DMA} AND {SIZE} < {self.limit_bytes}"

    @property
    def ideal_ns(self) -> float:
        """The small transfers' bytes at full bandwidth."""
        return self.small_bytes / self.bytes_per_s * 1e9 if self.bytes_per_s > 0 else 0.0


class SmallDma(Rule[Transfers]):
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

    def measure(self, ctx: AnalysisContext) -> Transfers:
        spec = ctx.spec
        limit = int(spec.dma_min_efficient_bytes or self.SMALL_DMA_BYTES)
        bw = float(spec.dma_bytes_per_s or spec.hbm_bytes_per_s or 0.0)
        agg = ctx.one(
            f"""SELECT count(*) AS n, count(*) FILTER (WHERE {SIZE} < {limit}) AS small,
                   coalesce(sum(dur_ns) FILTER (WHERE {SIZE} < {limit}), 0) AS ns,
                   coalesce(sum({SIZE}) FILTER (WHERE {SIZE} < {limit}), 0) AS bytes
            FROM {ctx.events_of(("dma",), "device")} WHERE {DMA}"""
        )
        return Transfers(
            transfers=int(agg.get("n") or 0),
            small=int(agg.get("small") or 0),
            small_ns=int(agg.get("ns") or 0),
            small_bytes=int(agg.get("bytes") or 0),
            limit_bytes=limit,
            bytes_per_s=bw,
        )

    def gate(self, facts: Transfers) -> bool:
        k = facts.small
        return k >= self.MIN_COUNT and k >= self.MIN_SMALL_SHARE * facts.transfers

    def evidence(self, ctx: AnalysisContext, facts: Transfers) -> Evidence:
        return Evidence(
            event_ids=longest_ids(ctx, facts.where),
            ops=top_ops(ctx, facts.where),
            source_lines=top_lines(ctx, facts.where),
            metrics={
                "small_transfers": facts.small,
                "transfers": facts.transfers,
                "small_dma_ns": facts.small_ns,
                "small_bytes": facts.small_bytes,
                "limit_bytes": facts.limit_bytes,
            },
        )

    def explain(self, facts: Transfers, evidence: Evidence) -> Draft:
        k, n, ns, limit = facts.small, facts.transfers, facts.small_ns, facts.limit_bytes
        return Draft(
            title=f"{k} DMA transfers under {limit} bytes ({fmt_pct(k / n)} of transfers, "
            f"{fmt_ms(ns)})",
            detail=(
                f"{k} of {n} DMA transfers move less than {limit} bytes (mean "
                f"{facts.small_bytes / k:.0f} B), taking {fmt_ms(ns)}; at full bandwidth their "
                f"bytes would take {fmt_ms(facts.ideal_ns)}."
            ),
            saving_ns=ns - facts.ideal_ns,
            evidence=evidence,
        )

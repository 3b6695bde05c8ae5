"""small-dma: many DMA transfers too small to use the DMA engines' bandwidth."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import pyarrow as pa

from .. import intervals
from ..context import AnalysisContext
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import (
    HOST_BOUND,
    Draft,
    Rule,
    device_busy_ns,
    fmt_ms,
    fmt_pct,
    host_bound,
    longest_ids,
    top_lines,
    top_ops,
)

DMA = "layer = 'device' AND kind = 'dma'"
SIZE = "coalesce(bytes_written, bytes_read, 0)"
# whose transfers: a kernel's own loads and stores (its parent), inside a compiled graph, in
# the optimizer's step, or a host copy's (no kernel around it)
SOURCES = ("host_copies", "optimizer", "compiled", "kernels")


@dataclass(frozen=True)
class Transfers:
    transfers: int
    small: int  # under limit_bytes
    small_ns: int  # their durations added up (transfers on parallel queues overlap)
    small_bytes: int
    limit_bytes: int
    bytes_per_s: float  # the DMA bandwidth (0 without a spec)
    exposed_ns: int = 0  # device time when only small transfers run (no compute, no large DMA)
    busy_ns: int = 0  # the device's busy time in the steps
    by_source: tuple[tuple[str, int], ...] = ()  # (source, ns of small transfers)
    host_bound: bool = False  # launch-bound steps: the host, not the device, sets their time
    # each kernel whose small transfers run alone: (kernel id, its new time: less that exposed
    # time, plus their bytes at full bandwidth), the change a replay applies
    kernels: tuple[tuple[int, int], ...] = ()

    @property
    def where(self) -> str:
        return f"{DMA} AND {SIZE} < {self.limit_bytes}"

    @property
    def ideal_ns(self) -> float:
        """The small transfers' bytes at full bandwidth."""
        return self.small_bytes / self.bytes_per_s * 1e9 if self.bytes_per_s > 0 else 0.0

    @property
    def main_source(self) -> str:
        return max(self.by_source, key=lambda kv: kv[1])[0] if self.by_source else "kernels"


class SmallDma(Rule[Transfers]):
    """DMA transfers under the efficient size.

    Pattern: each DMA pays a fixed setup cost; transfers under a few KiB (per-element indexing,
    tiny tensors, small parameters, non-contiguous slices moved piece by piece) run far below
    the DMA bandwidth.
    Algorithm: device events of kind dma, sized by bytes_written (else bytes_read). Transfers
    under the spec's dma_min_efficient_bytes (SMALL_DMA_BYTES without a spec) are small; report
    when there are at least MIN_COUNT of them and they are at least MIN_SMALL_SHARE of all
    transfers. Whose they are decides the fix: a kernel's own (its parent), the optimizer's
    (launched inside Optimizer.step), a compiled graph's, or a host copy's. Transfers on
    parallel queues and under compute overlap, so what they cost is the device time when only
    small transfers run (no compute instruction, no large transfer) less the time their bytes
    take at full bandwidth (the title's figure). The saving is its replay: each kernel whose
    small transfers run alone shortened by its part of that (a stretch of small transfers
    belongs to the kernel of its first), so steps the host sets (launch-bound) save ~nothing.
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
    fixes: ClassVar[dict[str, str]] = {  # by whose the transfers are (SOURCES)
        "host_copies": fix,
        "optimizer": (
            "These are the optimizer's own transfers: it updates each small parameter (biases, "
            "norm weights) and its state separately. Keep small parameters together (one flat "
            "tensor for the optimizer, as ZeRO/FSDP's flat parameters do) or compile the "
            "optimizer step with torch.compile(backend='neuron'); a host-side batching of "
            "copies does not change them."
        ),
        "compiled": (
            "These are the compiled graphs' own transfers of small tensors (the graph is "
            "already fused): a larger batch or sequence makes each transfer larger; there are "
            "no host copies to batch."
        ),
        "kernels": (
            "These are the kernels' own loads and stores of small tensors, not host copies: "
            "fuse the small ops with torch.compile(backend='neuron') so small intermediates "
            "stay on chip, and use a larger batch so each transfer moves more."
        ),
    }

    def measure(self, ctx: AnalysisContext) -> Transfers:
        spec = ctx.spec
        limit = int(spec.dma_min_efficient_bytes or self.SMALL_DMA_BYTES)
        bw = float(spec.dma_bytes_per_s or spec.hbm_bytes_per_s or 0.0)
        table = ctx.events_of(("dma",), "device")
        agg = ctx.one(
            f"""SELECT count(*) AS n, count(*) FILTER (WHERE {SIZE} < {limit}) AS small,
                   coalesce(sum(dur_ns) FILTER (WHERE {SIZE} < {limit}), 0) AS ns,
                   coalesce(sum({SIZE}) FILTER (WHERE {SIZE} < {limit}), 0) AS bytes
            FROM {table} WHERE {DMA}"""
        )
        facts = Transfers(
            transfers=int(agg.get("n") or 0),
            small=int(agg.get("small") or 0),
            small_ns=int(agg.get("ns") or 0),
            small_bytes=int(agg.get("bytes") or 0),
            limit_bytes=limit,
            bytes_per_s=bw,
        )
        if not self.gate(facts):
            return facts
        exposed, kernels = _exposed(ctx, limit, bw)
        return replace(facts, exposed_ns=exposed, busy_ns=device_busy_ns(ctx),
                       by_source=_by_source(ctx, table, facts.where),
                       host_bound=host_bound(ctx), kernels=kernels)  # fmt: skip

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
                "exposed_ns": facts.exposed_ns,
                "device_busy_ns": facts.busy_ns,
                **{f"{source}_ns": ns for source, ns in facts.by_source},
            },
        )

    def explain(self, facts: Transfers, evidence: Evidence) -> Draft:
        k, n, ns, limit = facts.small, facts.transfers, facts.small_ns, facts.limit_bytes
        shares = ", ".join(
            f"{fmt_pct(v / ns)} {SOURCE_WORDS[s]}" for s, v in facts.by_source if v and ns
        )
        saving = min(max(facts.exposed_ns - facts.ideal_ns, 0.0), float(facts.busy_ns))
        return Draft(
            title=f"{k} DMA transfers under {limit} bytes ({fmt_pct(k / n)} of transfers, "
            f"{fmt_ms(facts.exposed_ns)} of device time)",
            detail=(
                f"{k} of {n} DMA transfers move less than {limit} bytes (mean "
                f"{facts.small_bytes / k:.0f} B; {shares}). They take {fmt_ms(ns)} added up "
                f"over the parallel queues, and the device runs nothing else for "
                f"{fmt_ms(facts.exposed_ns)}; at full bandwidth their bytes would take "
                f"{fmt_ms(facts.ideal_ns)}." + (HOST_BOUND if facts.host_bound else "")
            ),
            saving_ns=saving,
            fix=self.fixes[facts.main_source],
            evidence=evidence,
            change=Replayed(
                f"these {len(facts.kernels)} kernels without their small transfers' exposed "
                "time (their bytes moved at full bandwidth instead)",
                "",
                "set_each",
                each=facts.kernels,
            ),
        )


SOURCE_WORDS = {
    "host_copies": "host copies",
    "optimizer": "the optimizer's kernels",
    "compiled": "compiled graphs",
    "kernels": "other kernels' own",
}


def _by_source(ctx: AnalysisContext, table: str, where: str) -> tuple[tuple[str, int], ...]:
    """The small transfers' time by whose they are (SOURCES)."""
    row = ctx.one(
        f"""WITH s AS (SELECT flow_id, parent_id, op_name, dur_ns FROM {table} WHERE {where}),
             l AS (SELECT flow_id, any_value(parent_id) AS op_id FROM ev
                   WHERE layer = 'host' AND kind = 'runtime' AND flow_id IS NOT NULL
                   GROUP BY flow_id),
             x AS (SELECT s.dur_ns,
                     CASE WHEN s.parent_id IS NULL THEN 'host_copies'
                          WHEN coalesce(s.op_name, '') LIKE 'neuron_graph_%' THEN 'compiled'
                          WHEN l.op_id IN (SELECT id FROM optimizer_ops) THEN 'optimizer'
                          ELSE 'kernels' END AS source
                   FROM s LEFT JOIN l USING (flow_id))
        SELECT {
            ", ".join(
                f"coalesce(sum(dur_ns) FILTER (WHERE source = '{s}'), 0) AS {s}" for s in SOURCES
            )
        }
        FROM x"""  # fmt: skip
    )
    return tuple((s, int(row.get(s) or 0)) for s in SOURCES)


def _exposed(
    ctx: AnalysisContext, limit: int, bw: float
) -> tuple[int, tuple[tuple[int, int], ...]]:
    """Device time covered by small transfers and by no other device work (compute
    instructions, large transfers, collectives; kernel spans hold their transfers); and each
    kernel's new time with its share of it replaced by its small transfers' bytes at `bw`
    (a stretch of small transfers belongs to the kernel of the first transfer in it)."""
    cols = ctx.cols
    dma = cols.where("layer", ("device",)) & cols.where("kind", ("dma",))
    written = cols.ints("bytes_written", -1)
    size = np.where(written >= 0, written, cols.ints("bytes_read", 0))
    small = dma & (size < limit)
    other = cols.where("layer", ("device",)) & ~cols.where("kind", ("kernel",)) & ~small
    merged = ctx.merge_rows(small)
    if merged.num_rows == 0:
        return 0, ()
    windows = pa.table({"rank": merged["rank"], "ws": merged["s"], "we": merged["e"]})
    hidden = intervals.covered(ctx.merge_rows(other), ["rank"], windows)
    starts = merged["s"].to_numpy(zero_copy_only=False)
    exposed = merged["e"].to_numpy(zero_copy_only=False) - starts - hidden
    at = np.flatnonzero(small)
    parent = cols.ints("parent_id", -1)[at]
    first: dict[
        tuple[int, int], int
    ] = {}  # (rank, start) -> the kernel of the first small transfer starting there
    for r, st, k in zip(cols.ints("rank")[at], cols.ints("start_ns")[at], parent, strict=True):
        first.setdefault((int(r), int(st)), int(k))
    cut: dict[int, float] = {}
    for r, st, x in zip(merged["rank"].to_pylist(), starts, exposed, strict=True):
        k = first.get((int(r), int(st)), -1)
        if k >= 0 and x > 0:
            cut[k] = cut.get(k, 0.0) + float(x)
    moved: dict[int, float] = {}  # each kernel's small bytes at full bandwidth
    if bw > 0:
        for k, b in zip(parent, size[at], strict=True):
            moved[int(k)] = moved.get(int(k), 0.0) + float(b) / bw * 1e9
    ids = cols.ints("id")
    held = np.isin(ids, np.fromiter(cut, np.int64, len(cut)))
    dur = dict(zip(ids[held].tolist(), cols.ints("dur_ns")[held].tolist(), strict=True))
    kernels = tuple(sorted(
        (k, int(round(dur[k] - max(c - moved.get(k, 0.0), 0.0))))
        for k, c in cut.items() if k in dur and c > moved.get(k, 0.0)
    ))  # fmt: skip
    return int(np.sum(exposed)), kernels

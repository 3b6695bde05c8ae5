"""memory-bound-op: kernels limited by HBM bandwidth, below the machine balance of their dtype."""

from __future__ import annotations

from dataclasses import dataclass

from ..compiled import GRAPH_KERNEL_SQL
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
    hotspots,
    longest_ids,
    top_lines,
)

KERNELS = "layer = 'device' AND kind = 'kernel'"
BYTES = "(coalesce(bytes_read, 0) + coalesce(bytes_written, 0))"
# a kernel with a float32 (or float64, computed as float32) operand runs TensorE at the fp32 rate
FP32 = "(coalesce(dtypes, '') LIKE '%float32%' OR coalesce(dtypes, '') LIKE '%float64%')"


@dataclass(frozen=True)
class Roofline:
    balance: float  # bf16: FLOP per HBM byte under which a kernel is memory-bound
    balance_fp32: float  # the same at TensorE's fp32 rate
    kernel_ns: int
    bound_ns: int  # in memory-bound kernels
    eager_ns: int  # of which eager kernels (torch.compile would fuse them)
    compiled_fp32_ns: int  # of which compiled float32 kernels (already fused; bf16 halves bytes)
    busy_ns: int  # the device's busy time in the steps
    host_bound: bool = False  # launch-bound steps: the host, not the device, sets their time

    @property
    def where(self) -> str:
        ridge = f"CASE WHEN {FP32} THEN {self.balance_fp32} ELSE {self.balance} END"
        return f"{KERNELS} AND {BYTES} > 0 AND coalesce(flops, 0) / {BYTES} < {ridge}"

    @property
    def claimable_ns(self) -> float:
        """The memory-bound time a fix reaches, within the device's busy time (kernels that
        overlap count their share of it once)."""
        ns = float(self.eager_ns + self.compiled_fp32_ns)
        if self.kernel_ns > self.busy_ns > 0:
            ns *= self.busy_ns / self.kernel_ns
        return ns


class MemoryBoundOp(Rule[Roofline]):
    """Ops whose arithmetic intensity is under the chip's machine balance for their dtype
    (roofline).

    Pattern: elementwise and normalisation ops move more bytes than they compute; run one by
    one, each reads and writes HBM and the engines wait on memory.
    Algorithm: for neuron kernels with bytes in the steps, arithmetic intensity = flops /
    (bytes_read + bytes_written); the machine balance is the spec's machine_balance (else
    peak_flops_bf16 / memory bandwidth) for bf16 kernels and peak_flops_fp32 / memory bandwidth
    for kernels with a float32 or float64 operand (TensorE runs fp32 at a quarter of the bf16
    rate, so an fp32 matmul is compute-bound at a quarter of the intensity). Kernels under
    BALANCE_FRACTION of their balance are memory-bound. Report when they take at least
    MIN_SHARE of kernel time. The saving is FUSION_SAVING of the eager ones (fusing a chain
    removes the intermediate HBM round trips) plus BF16_SAVING of the compiled float32 ones
    (already fused: bf16 halves their bytes), never more than their share of the device's busy
    time; with launch-bound steps the detail says the step shortens less than that.
    """

    id = "memory-bound-op"
    title = "Memory-bound ops"
    severity = "low"
    scope = "neuron"
    BALANCE_FRACTION = 1.0
    MIN_SHARE = 0.20
    FUSION_SAVING = 0.5
    BF16_SAVING = 0.5
    fix = (
        "Fuse the elementwise chains with torch.compile(backend='neuron') so intermediates stay "
        "in SBUF, and use bf16 activations to halve the bytes moved."
    )

    def measure(self, ctx: AnalysisContext) -> Roofline | None:
        spec = ctx.spec
        bw = float(spec.memory_bytes_per_s or spec.hbm_bytes_per_s or 0)
        peak, peak32 = float(spec.peak_flops_bf16 or 0), float(spec.peak_flops_fp32 or 0)
        ridge = float(spec.machine_balance or (peak / bw if peak > 0 and bw > 0 else 0))
        if ridge <= 0:
            return None
        ridge32 = peak32 / bw if peak32 > 0 and bw > 0 else ridge
        facts = Roofline(ridge * self.BALANCE_FRACTION, ridge32 * self.BALANCE_FRACTION,
                         0, 0, 0, 0, 0)  # fmt: skip
        in_steps = "AND step IS NOT NULL" if ctx.has_steps else ""
        agg = ctx.one(
            f"""SELECT coalesce(sum(dur_ns), 0) AS total,
                   coalesce(sum(dur_ns) FILTER (WHERE {facts.where}), 0) AS ns,
                   coalesce(sum(dur_ns) FILTER (WHERE {facts.where}
                       AND NOT {GRAPH_KERNEL_SQL}), 0) AS eager,
                   coalesce(sum(dur_ns) FILTER (WHERE {facts.where}
                       AND {GRAPH_KERNEL_SQL} AND {FP32}), 0) AS compiled32
            FROM ev WHERE {KERNELS} {in_steps}"""
        )
        return Roofline(
            facts.balance, facts.balance_fp32, int(agg.get("total") or 0),
            int(agg.get("ns") or 0), int(agg.get("eager") or 0),
            int(agg.get("compiled32") or 0), device_busy_ns(ctx), host_bound(ctx),
        )  # fmt: skip

    def gate(self, facts: Roofline) -> bool:
        return facts.kernel_ns > 0 and facts.bound_ns >= self.MIN_SHARE * facts.kernel_ns

    def evidence(self, ctx: AnalysisContext, facts: Roofline) -> Evidence:
        ops = hotspots(
            ctx.rows(
                f"""SELECT coalesce(op_name, name) AS label, sum(dur_ns) AS dur_ns,
                       count(*) AS count,
                       'intensity ' || round(sum(coalesce(flops, 0)) / sum({BYTES}), 2)
                       || ' FLOP/B' AS note
                FROM ev WHERE {facts.where} GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5"""
            ),
            note="note",
        )
        return Evidence(
            event_ids=longest_ids(ctx, facts.where),
            ops=ops,
            source_lines=top_lines(ctx, facts.where),
            metrics={
                "memory_bound_ns": facts.bound_ns,
                "eager_memory_bound_ns": facts.eager_ns,
                "compiled_fp32_memory_bound_ns": facts.compiled_fp32_ns,
                "kernel_ns": facts.kernel_ns,
                "device_busy_ns": facts.busy_ns,
                "machine_balance_flop_per_byte": round(facts.balance, 3),
                "machine_balance_fp32_flop_per_byte": round(facts.balance_fp32, 3),
            },
        )

    def explain(self, facts: Roofline, evidence: Evidence) -> Draft:
        ns, total = facts.bound_ns, facts.kernel_ns
        b16, b32 = facts.balance, facts.balance_fp32
        compiled = ns - facts.eager_ns
        where = f"; {fmt_ms(compiled)} of it in compiled graphs, already fused" if compiled else ""
        saving = self.FUSION_SAVING * facts.eager_ns + self.BF16_SAVING * facts.compiled_fp32_ns
        claimable = facts.eager_ns + facts.compiled_fp32_ns
        if claimable:
            saving *= facts.claimable_ns / claimable
        return Draft(
            title=f"Memory-bound ops take {fmt_pct(ns / total)} of kernel time "
            f"({fmt_ms(ns)}), below the machine balance",
            detail=(
                f"Kernels that do fewer FLOP per HBM byte than the chip's machine balance "
                f"({b16:.0f} FLOP/B in bf16, {b32:.0f} in fp32) take {fmt_ms(ns)} of "
                f"{fmt_ms(total)} kernel time{where}: HBM bandwidth, not TensorE, limits them."
                + (HOST_BOUND if facts.host_bound else "")
            ),
            saving_ns=saving,
            fix=self.fix
            if facts.eager_ns
            else (
                "These kernels are compiled graphs, already fused: use bf16 activations "
                "(torch.autocast, or the model in bf16) to halve the bytes they move."
            ),  # fmt: skip
            evidence=evidence,
            # the kernels a fix reaches: eager ones fused, compiled fp32 ones in bf16 (both
            # halve the time: FUSION_SAVING and BF16_SAVING are equal)
            change=Replayed(
                f"these memory-bound kernels fused, or in bf16 where already compiled (their "
                f"time cut by {self.FUSION_SAVING:.0%})",
                f"{facts.where} AND (NOT {GRAPH_KERNEL_SQL} OR {FP32})",
                "scale",
                factor=1 / (1 - self.FUSION_SAVING),
            ),  # fmt: skip
        )

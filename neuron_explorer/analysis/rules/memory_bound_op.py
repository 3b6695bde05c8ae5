"""memory-bound-op: kernels limited by HBM bandwidth, below the machine balance."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct, hotspots, longest_ids, top_lines

KERNELS = "layer = 'device' AND kind = 'kernel'"
BYTES = "(coalesce(bytes_read, 0) + coalesce(bytes_written, 0))"


@dataclass(frozen=True)
class Roofline:
    balance: float  # FLOP per HBM byte under which a kernel is memory-bound
    kernel_ns: int
    bound_ns: int  # in memory-bound kernels

    @property
    def where(self) -> str:
        return f"{KERNELS} AND {BYTES} > 0 AND coalesce(flops, 0) / {BYTES} < {self.balance}"


class MemoryBoundOp(Rule[Roofline]):
    """Ops whose arithmetic intensity is under the chip's machine balance (roofline).

    Pattern: elementwise and normalisation ops move more bytes than they compute; run one by
    one, each reads and writes HBM and the engines wait on memory.
    Algorithm: for neuron kernels with bytes, arithmetic intensity = flops / (bytes_read +
    bytes_written); the machine balance is the spec's machine_balance (else peak_flops_bf16 /
    hbm_bytes_per_s). Kernels
    under BALANCE_FRACTION of the balance are memory-bound. Report when they take at least
    MIN_SHARE of kernel time; the saving assumed is FUSION_SAVING of their time (fusing a chain
    removes the intermediate HBM round trips).
    """

    id = "memory-bound-op"
    title = "Memory-bound ops"
    severity = "low"
    scope = "neuron"
    BALANCE_FRACTION = 1.0
    MIN_SHARE = 0.20
    FUSION_SAVING = 0.5
    fix = (
        "Fuse the elementwise chains with torch.compile(backend='neuron') so intermediates stay "
        "in SBUF, and use bf16 activations to halve the bytes moved."
    )

    def measure(self, ctx: AnalysisContext) -> Roofline | None:
        spec = ctx.spec
        peak, bw = float(spec.peak_flops_bf16 or 0), float(spec.hbm_bytes_per_s or 0)
        ridge = float(spec.machine_balance or (peak / bw if peak > 0 and bw > 0 else 0))
        if ridge <= 0:
            return None
        balance = ridge * self.BALANCE_FRACTION
        agg = ctx.one(
            f"""SELECT coalesce(sum(dur_ns), 0) AS total,
                   coalesce(sum(dur_ns) FILTER (WHERE {BYTES} > 0
                       AND coalesce(flops, 0) / {BYTES} < {balance}), 0) AS ns
            FROM ev WHERE {KERNELS}"""
        )
        return Roofline(balance, int(agg.get("total") or 0), int(agg.get("ns") or 0))

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
                "kernel_ns": facts.kernel_ns,
                "machine_balance_flop_per_byte": round(facts.balance, 3),
            },
        )

    def explain(self, facts: Roofline, evidence: Evidence) -> Draft:
        ns, total, balance = facts.bound_ns, facts.kernel_ns, facts.balance
        return Draft(
            title=f"Memory-bound ops take {fmt_pct(ns / total)} of kernel time "
            f"({fmt_ms(ns)}), below {balance:.0f} FLOP/B",
            detail=(
                f"Kernels that do fewer than {balance:.0f} FLOP per HBM byte (the chip's "
                f"machine balance) take {fmt_ms(ns)} of {fmt_ms(total)} kernel time: "
                "HBM bandwidth, not TensorE, limits them."
            ),
            saving_ns=ns * self.FUSION_SAVING,
            evidence=evidence,
            change=Replayed(
                f"these memory-bound kernels fused (their time cut by {self.FUSION_SAVING:.0%})",
                facts.where,
                "scale",
                factor=1 / (1 - self.FUSION_SAVING),
            ),  # fmt: skip
        )

"""fp32-matmul: matmuls in float32 where bf16 would run several times faster on TensorE."""

from __future__ import annotations

from dataclasses import dataclass

from ..bf16 import Bf16Estimate, estimate
from ..context import AnalysisContext
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct, longest_ids, top_lines, top_ops
from ..shapes import MATMUL_OP_SQL

MATMUL = (
    "layer = 'device' AND kind = 'kernel' "
    f"AND (json_extract(args, '$.matmul') IS NOT NULL OR {MATMUL_OP_SQL})"
)
FP32_DTYPE = r'(float32|"float"|^float$)'  # torch names float32; Kineto writes "float"
FP32 = (
    f"{MATMUL} AND regexp_matches(coalesce(json_extract_string(args, '$.matmul.dtype'), "
    f"dtypes, ''), '{FP32_DTYPE}')"
)


@dataclass(frozen=True)
class Matmuls:
    kernels_ns: int  # all kernels
    fp32_ns: int  # the fp32 matmuls
    fp32: int
    speedup: float  # TensorE bf16 over fp32
    est: Bf16Estimate | None  # predicted only when the fp32 matmuls' share passes


class Fp32Matmul(Rule[Matmuls]):
    """float32 matmuls on TensorE.

    Pattern: TensorE's bf16 peak is several times its fp32 peak (4x on trn2); a model left in
    float32 runs every matmul at the slow rate. But a small matmul is mostly DMA and fixed
    cost, and autocast adds a cast around each one, so bf16 can cost more than it saves.
    Algorithm: neuron matmul kernels (op_name mm/addmm/bmm/matmul/linear, or args.matmul) whose
    input dtypes (args.matmul.dtype, else the dtypes column) are float32. Report when they take
    at least MIN_SHARE of all kernel time. With speedup = peak_flops_bf16 / peak_flops_fp32
    from the spec (DEFAULT_SPEEDUP without one), their bf16 time and the casts autocast adds
    are predicted from the profile's own kernels (analysis/bf16.py): each matmul's time less
    its TensorE instructions' time x (1 - 1/speedup); casts, one per input of each forward
    fp32 matmul plus its gradient's cast back, at the cost of the profile's elementwise
    kernels of that size (a least-squares fit on bytes). When autocast's net device-time
    saving (matmul saving less the casts) is at least MIN_NET_SHARE of the fp32 matmul time,
    the fix is autocast and the saving is that net; otherwise, when a bf16 model would gain
    that share, the fix is casting the model (model.to(torch.bfloat16): no per-op casts, only
    its input's and output's) and the saving is the matmul saving less those casts; else
    nothing is reported. The title and metrics give that device (kernel) time; the saving is
    its replay: each matmul at its predicted bf16 time (plus, for autocast, the casts around
    it), so in a launch-bound step, whose time follows the host, it saves little.
    """

    id = "fp32-matmul"
    title = "float32 matmuls (bf16 is faster on TensorE)"
    severity = "medium"
    scope = "neuron"
    MIN_SHARE = 0.10
    DEFAULT_SPEEDUP = 4.0
    MIN_NET_SHARE = 0.05  # autocast must win back this share of the fp32 matmul time
    fix = (
        "Run the matmuls in bf16: wrap the forward pass in torch.autocast('neuron', "
        "dtype=torch.bfloat16) (keeps fp32 master weights) when the predicted net saving, "
        "casts counted, is positive; otherwise cast the model with model.to(torch.bfloat16)."
    )

    def measure(self, ctx: AnalysisContext) -> Matmuls:
        spec = ctx.spec
        bf16, fp32 = float(spec.peak_flops_bf16 or 0), float(spec.peak_flops_fp32 or 0)
        speedup = bf16 / fp32 if bf16 > 0 and fp32 > 0 else self.DEFAULT_SPEEDUP
        agg = ctx.one(
            f"""SELECT coalesce(sum(dur_ns), 0) AS total,
                   coalesce(sum(dur_ns) FILTER (WHERE {FP32}), 0) AS ns,
                   count(*) FILTER (WHERE {FP32}) AS n
            FROM {ctx.events_of(("kernel",), "device")}
            WHERE layer = 'device' AND kind = 'kernel'"""
        )
        total, ns, n = (int(agg.get(k) or 0) for k in ("total", "ns", "n"))
        # the prediction reads many kernels: only for a share worth judging
        big = total > 0 and ns >= self.MIN_SHARE * total
        return Matmuls(total, ns, n, speedup, estimate(ctx, FP32, speedup) if big else None)

    def autocast_pays(self, est: Bf16Estimate) -> bool:
        return est.autocast_net_ns >= self.MIN_NET_SHARE * est.matmul_ns

    def gate(self, facts: Matmuls) -> bool:
        est = facts.est
        if est is None:
            return False
        return self.autocast_pays(est) or est.model_net_ns >= self.MIN_NET_SHARE * est.matmul_ns

    def evidence(self, ctx: AnalysisContext, facts: Matmuls) -> Evidence:
        assert facts.est is not None  # the gate passed
        est = facts.est
        return Evidence(
            event_ids=longest_ids(ctx, FP32),
            ops=top_ops(ctx, FP32),
            source_lines=top_lines(ctx, FP32),
            metrics={
                "fp32_matmuls": facts.fp32,
                "fp32_matmul_ns": facts.fp32_ns,
                "speedup": facts.speedup,
                "bf16_matmul_ns": est.bf16_matmul_ns,
                "casts": est.casts,
                "cast_ns": est.cast_ns,
                "autocast_net_ns": est.autocast_net_ns,
                "matmul_saving_ns": est.matmul_saving_ns,
                "model_cast_ns": est.model_cast_ns,
                "model_net_ns": est.model_net_ns,
            },
        )

    def explain(self, facts: Matmuls, evidence: Evidence) -> Draft:
        assert facts.est is not None
        est, n, ns, total = facts.est, facts.fp32, facts.fp32_ns, facts.kernels_ns
        autocast = self.autocast_pays(est)
        saving = est.autocast_net_ns if autocast else est.model_net_ns
        casts = (
            f"autocast would add ~{est.casts} casts ({fmt_ms(est.cast_ns)}) around the "
            f"{est.forward} forward matmuls"
        )
        share = f"{n} float32 matmuls take {fmt_pct(ns / total)} of kernel time"
        if autocast:
            title = (
                f"{share}; autocast to bf16 would save ~{fmt_ms(saving)} of device time, "
                "casts counted"
            )
            fix = (
                "Wrap the forward pass in torch.autocast('neuron', dtype=torch.bfloat16) "
                f"(keeps fp32 master weights): predicted net saving {fmt_ms(saving)} of "
                "device time with its casts counted."
            )
        else:
            title = (
                f"{share}; autocast would not pay (its casts cost more), a bf16 model would "
                f"save ~{fmt_ms(saving)} of device time"
            )
            fix = (
                "Cast the model instead of autocasting: model.to(torch.bfloat16) (and the "
                "float inputs with .to(torch.bfloat16)) runs the matmuls in bf16 without a "
                f"cast around each; {casts}, more than the {fmt_ms(est.matmul_saving_ns)} the "
                "matmuls gain. Check the numerics: there are no fp32 master weights then."
            )
        return Draft(
            title=title,
            detail=(
                f"{n} matmul kernels run in float32 ({fmt_ms(ns)}). In bf16 they would take "
                f"about {fmt_ms(est.bf16_matmul_ns)} (TensorE runs bf16 {facts.speedup:.1f}x "
                "faster, but these kernels also move bytes and pay a fixed cost, so they "
                f"gain less); {casts}, so autocast's net device-time saving is "
                f"{fmt_ms(est.autocast_net_ns)}. Device time: while the step is "
                "launch-bound, the step time follows the host's launches instead."
                + (
                    ""
                    if est.fitted
                    else " (No elementwise kernels to learn a cast's cost from: casts "
                    "counted at the HBM bandwidth.)"
                )
            ),
            saving_ns=saving,
            fix=fix,
            evidence=evidence,
            change=replayed(est, autocast),
        )


def replayed(est: Bf16Estimate, autocast: bool) -> Replayed:
    """The fix as a replay: each matmul at its predicted bf16 time, with autocast's casts
    around it, or in a bf16 model with its few boundary casts shared out."""
    how = (" with autocast's casts around each" if autocast
           else " in a bf16 model (its boundary casts shared out)")  # fmt: skip
    each = est.autocast_each() if autocast else est.model_each()
    return Replayed(f"these {est.matmuls} matmuls at their predicted bf16 time{how}", "",
                    "set_each", each=each)  # fmt: skip

"""fp32-matmul: matmuls in float32 where bf16 would run several times faster on TensorE."""

from __future__ import annotations

from ..context import AnalysisContext
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, fmt_pct, longest_ids, register, top_lines, top_ops
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


@register
class Fp32Matmul(Rule):
    """float32 matmuls on TensorE.

    Pattern: TensorE's bf16 peak is several times its fp32 peak (4x on trn2); a model left in
    float32 runs every matmul at the slow rate.
    Algorithm: neuron matmul kernels (op_name mm/addmm/bmm/matmul/linear, or args.matmul) whose
    input dtypes (args.matmul.dtype, else the dtypes column) are float32. Report when they take
    at least MIN_SHARE of all kernel time. With speedup = peak_flops_bf16 / peak_flops_fp32
    from the spec (DEFAULT_SPEEDUP without one), the saving is their time x (1 - 1/speedup).
    """

    id = "fp32-matmul"
    title = "float32 matmuls (bf16 is faster on TensorE)"
    severity = "medium"
    scope = "neuron"
    MIN_SHARE = 0.10
    DEFAULT_SPEEDUP = 4.0
    fix = (
        "Run the matmuls in bf16: wrap the forward pass in torch.autocast('neuron', "
        "dtype=torch.bfloat16) (keeps fp32 master weights), or cast the model with "
        "model.to(torch.bfloat16)."
    )

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        spec = ctx.device_spec
        bf16, fp32 = (
            float(spec.get("peak_flops_bf16") or 0),
            float(spec.get("peak_flops_fp32") or 0),
        )
        speedup = bf16 / fp32 if bf16 > 0 and fp32 > 0 else self.DEFAULT_SPEEDUP
        agg = ctx.one(
            f"""SELECT coalesce(sum(dur_ns), 0) AS total,
                   coalesce(sum(dur_ns) FILTER (WHERE {FP32}), 0) AS ns,
                   count(*) FILTER (WHERE {FP32}) AS n
            FROM {ctx.events_of(("kernel",), "device")} WHERE layer = 'device' AND kind = 'kernel'"""
        )
        total, ns, n = (int(agg.get(k) or 0) for k in ("total", "ns", "n"))
        if total <= 0 or ns < self.MIN_SHARE * total:
            return []
        saving = ns * (1 - 1 / speedup)
        return [
            self.finding(
                ctx,
                title=f"{n} float32 matmuls take {fmt_pct(ns / total)} of kernel time; bf16 "
                f"would save ~{fmt_ms(saving)}",
                detail=(
                    f"{n} matmul kernels run in float32 ({fmt_ms(ns)}). TensorE runs bf16 "
                    f"{speedup:.1f}x faster, so autocast would cut them to about "
                    f"{fmt_ms(ns / speedup)}."
                ),
                saving_ns=saving,
                evidence=Evidence(
                    event_ids=longest_ids(ctx, FP32),
                    ops=top_ops(ctx, FP32),
                    source_lines=top_lines(ctx, FP32),
                    metrics={"fp32_matmuls": n, "fp32_matmul_ns": ns, "speedup": speedup},
                ),
            )
        ]

"""tensor-engine-padding: matmul dims that waste rows and columns of the 128x128 TensorE."""

from __future__ import annotations

from ..context import AnalysisContext
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, fmt_pct, hotspots, longest_ids, register, top_lines

MATMUL = "layer = 'device' AND kind = 'kernel' AND json_extract(args, '$.matmul') IS NOT NULL"
M = "TRY_CAST(json_extract(args, '$.matmul.m') AS BIGINT)"
K = "TRY_CAST(json_extract(args, '$.matmul.k') AS BIGINT)"
N = "TRY_CAST(json_extract(args, '$.matmul.n') AS BIGINT)"


@register
class TensorEnginePadding(Rule):
    """Matmuls whose dimensions are not multiples of the TensorE array size.

    Pattern: TensorE is a 128x128 systolic array: the contraction dim K maps onto its 128
    partitions and the output rows M onto its 128 columns (N streams through). A dim of 130
    uses two tiles, the second almost empty.
    Algorithm: neuron matmul kernels carry args.matmul {m, k, n}. With T = the spec's
    tensor_engine_dim (128), the used share of the tiles is (m*k) / (ceil(m/T)*T * ceil(k/T)*T)
    and the waste is 1 minus it. Kernels with waste >= MIN_WASTE count; report when their
    wasted time (duration x waste) is at least MIN_SHARE of matmul time, and claim it as the
    saving.
    """

    id = "tensor-engine-padding"
    title = "TensorE tiles wasted by matmul shapes"
    severity = "low"
    scope = "neuron"
    MIN_WASTE = 0.10
    MIN_SHARE = 0.05
    fix = (
        "Choose model dimensions (hidden size, heads x head_dim, batch x sequence) that are "
        "multiples of 128, or pad them up to the next multiple once, outside the step."
    )

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        t = int(ctx.device_spec.get("tensor_engine_dim") or 128)
        used = f"({M} * {K})::DOUBLE / ((ceil({M} / {t}) * {t}) * (ceil({K} / {t}) * {t}))"
        ctx.run(
            f"""CREATE OR REPLACE TEMP TABLE te_pad AS
            SELECT id, coalesce(op_name, name) AS op, src_file, src_line, src_func, dur_ns,
                   {M} AS m, {K} AS k, {N} AS n, 1 - {used} AS waste
            FROM ev WHERE {MATMUL} AND {M} > 0 AND {K} > 0"""
        )
        agg = ctx.one(
            f"""SELECT coalesce(sum(dur_ns), 0) AS total,
                   coalesce(sum(dur_ns * waste) FILTER (WHERE waste >= {self.MIN_WASTE}), 0)
                       AS wasted
            FROM te_pad"""
        )
        total, wasted = int(agg.get("total") or 0), float(agg.get("wasted") or 0.0)
        if total <= 0 or wasted < self.MIN_SHARE * total:
            return []
        cond = f"waste >= {self.MIN_WASTE}"
        ops = hotspots(
            ctx.rows(
                f"""SELECT op || ' ' || m || 'x' || k || 'x' || n AS label, sum(dur_ns) AS dur_ns,
                       count(*) AS count,
                       'waste ' || round(100 * any_value(waste), 1) || '%, pad to '
                       || (ceil(m / {t}) * {t})::BIGINT || 'x' || (ceil(k / {t}) * {t})::BIGINT
                       AS note
                FROM te_pad WHERE {cond} GROUP BY op, m, k, n
                ORDER BY sum(dur_ns * waste) DESC, label LIMIT 5"""
            ),
            note="note",
        )
        ids_where = f"id IN (SELECT id FROM te_pad WHERE {cond})"
        return [
            self.finding(
                ctx,
                title=f"Matmul shapes waste {fmt_pct(wasted / total)} of TensorE time "
                f"({fmt_ms(wasted)})",
                detail=(
                    f"Matmuls with dims that are not multiples of {t} leave parts of the "
                    f"{t}x{t} array idle: {fmt_ms(wasted)} of {fmt_ms(total)} matmul time is "
                    "spent on padding."
                ),
                saving_ns=wasted,
                evidence=Evidence(
                    event_ids=longest_ids(ctx, ids_where),
                    ops=ops,
                    source_lines=top_lines(ctx, ids_where),
                    metrics={"wasted_ns": wasted, "matmul_ns": total, "tile": t},
                ),
            )
        ]

"""What running a profile's float32 matmuls in bf16 would change on the device, counted from
the profile itself: the matmuls' TensorE work runs at the bf16 rate and autocast adds the casts
around them. Both come from the profile's own kernels, so the prediction follows the device that
ran them: a small matmul is mostly DMA and fixed cost and gains far less than the TensorE
speed-up, and a cast costs what the profile's elementwise kernels of that size cost.

bf16 matmul: its measured time less its TensorE instructions' time x (1 - 1/speedup) (a
profile without instruction events: its FLOPs at the fp32 peak, else its whole time). The DMA
part is kept as it is (bf16 halves the bytes, but a kernel's loads run in parallel over the DMA
queues, so their time hardly changes at these sizes): a lower bound of the gain.
Cast cost: a least-squares fit dur = a + b * bytes over the kernels that use only VectorE
(elementwise ops); without such kernels, bytes at the spec's HBM bandwidth (no spec: casts
counted as free, and the finding says the estimate is unfitted).
Casts autocast adds: each input of a forward fp32 matmul is cast to bf16 (an elementwise kernel
moving 6 bytes an element: 4 read, 2 written) and, when the profile has a backward pass, its
gradient is cast back (6 bytes an element again). A bf16 model (model.to(torch.bfloat16)) casts
only at its boundary: the input, the output for an fp32 loss and, with a backward, the output's
gradient: each costed as the median matmul input's cast.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from .context import AnalysisContext
from .shapes import parse_shapes

CAST_BYTES_PER_ELEMENT = 6  # fp32 -> bf16: read 4, write 2 (bf16 -> fp32 the other way round)
BACKWARD_SPAN_LIKE = "autograd::engine::evaluate_function:%"


@dataclass(frozen=True)
class Bf16Estimate:
    """matmul_ns / bf16_matmul_ns: the fp32 matmuls' time and its bf16 prediction; casts and
    cast_ns: what autocast adds; forward: the forward matmuls among them."""

    matmuls: int
    forward: int
    matmul_ns: int
    bf16_matmul_ns: int
    casts: int
    cast_ns: int
    fitted: bool
    model_cast_ns: int = 0  # what a bf16 model adds: its input's cast, its output's (and grad's)
    # per matmul kernel: (event id, its bf16 time, the casts autocast adds around it), the
    # prediction a replay applies (fp32-matmul)
    per_kernel: tuple[tuple[int, int, int], ...] = ()

    def autocast_each(self) -> tuple[tuple[int, int], ...]:
        """Each matmul's new time under autocast: its bf16 time plus the casts around it (a
        cast runs just before its matmul on the same queue)."""
        return tuple((i, bf16 + cast) for i, bf16, cast in self.per_kernel)

    def model_each(self) -> tuple[tuple[int, int], ...]:
        """Each matmul's new time in a bf16 model: its bf16 time, the model's few boundary
        casts shared out evenly (they run once a step, between the matmuls)."""
        n = len(self.per_kernel)
        extra = self.model_cast_ns / n if n else 0.0
        return tuple((i, round(bf16 + extra)) for i, bf16, _ in self.per_kernel)

    @property
    def matmul_saving_ns(self) -> int:
        return self.matmul_ns - self.bf16_matmul_ns

    @property
    def model_net_ns(self) -> int:
        """Device time a bf16 model (model.to(torch.bfloat16)) saves, its boundary casts counted."""
        return self.matmul_saving_ns - self.model_cast_ns

    @property
    def autocast_net_ns(self) -> int:
        """Device time autocast saves (negative: it costs more than it saves)."""
        return self.matmul_saving_ns - self.cast_ns


def _fit(x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Least-squares coefficients of y on the columns of x, None when the fit is degenerate or
    gives a negative coefficient (then the caller falls back)."""
    if len(y) < x.shape[1] + 1:
        return None
    try:
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    except np.linalg.LinAlgError:
        return None
    return coef if np.all(np.isfinite(coef)) and np.all(coef >= 0) else None


def _elementwise_fit(ctx: AnalysisContext) -> np.ndarray | None:
    instrs = ctx.events_of(("instruction",), "device")
    kernels = ctx.events_of(("kernel",), "device")
    rows = ctx.rows(
        f"""WITH only_vector AS (SELECT parent_id AS id FROM {instrs}
                                 WHERE kind = 'instruction' GROUP BY 1
                                 HAVING bool_and(track = 'VectorE'))
        SELECT k.dur_ns AS d, k.bytes_read + k.bytes_written AS b
        FROM {kernels} k JOIN only_vector USING (id)
        WHERE k.layer = 'device' AND k.kind = 'kernel' AND k.bytes_read IS NOT NULL
              AND k.bytes_written IS NOT NULL"""
    )
    if not rows:
        return None
    y = np.array([r["d"] for r in rows], float)
    b = np.array([r["b"] for r in rows], float)
    return _fit(np.c_[np.ones(len(y)), b], y)


def _tensor_engine_ns(row: dict, peak_flops_fp32: float) -> float:
    """A matmul kernel's TensorE time: its TensorE instructions' time; without instruction
    events, its FLOPs at the fp32 peak; without either, its whole time (an upper bound)."""
    if row["te"] is not None:
        return float(row["te"])
    if row["flops"] and peak_flops_fp32 > 0:
        return min(float(row["flops"]) / peak_flops_fp32 * 1e9, float(row["d"]))
    return float(row["d"])


def estimate(ctx: AnalysisContext, fp32_where: str, speedup: float) -> Bf16Estimate:
    """The bf16 estimate for the fp32 matmul kernels that `fp32_where` selects in `ev`."""
    instrs = ctx.events_of(("instruction",), "device")
    launches = ctx.events_of(("runtime",), "host")
    backward_spans = ctx.subset(
        "ev_backward_spans",
        ctx.cols.where("layer", ("host",)) & ctx.cols.like("name", (BACKWARD_SPAN_LIKE,)),
    )
    rows = ctx.rows(
        f"""WITH k AS (SELECT id, rank, flow_id, dur_ns, shapes, flops
                       FROM {ctx.events_of(("kernel",), "device")} WHERE {fp32_where}),
             te AS (SELECT parent_id AS id, sum(dur_ns) AS te FROM {instrs}
                    WHERE kind = 'instruction' AND track = 'TensorE'
                      AND parent_id IN (SELECT id FROM k) GROUP BY 1),
             bw AS (SELECT rank, track, start_ns AS s, start_ns + dur_ns AS e
                    FROM {backward_spans}),
             l AS (SELECT rank, track, flow_id, start_ns FROM {launches}
                   WHERE layer = 'host' AND kind = 'runtime' AND flow_id IN
                         (SELECT flow_id FROM k WHERE flow_id IS NOT NULL)),
             lb AS (SELECT DISTINCT l.rank, l.flow_id FROM l JOIN bw ON bw.rank = l.rank
                    AND bw.track = l.track AND l.start_ns >= bw.s AND l.start_ns < bw.e)
        SELECT k.id, k.dur_ns AS d, k.flops, te.te, k.shapes,
               lb.flow_id IS NOT NULL AS backward
        FROM k LEFT JOIN te USING (id) LEFT JOIN lb ON lb.rank = k.rank AND lb.flow_id = k.flow_id
        ORDER BY k.id"""
    )
    has_backward = bool(ctx.one(f"SELECT count(*) AS n FROM {backward_spans}").get("n"))
    d = np.array([r["d"] for r in rows], float)
    peak = ctx.manifest.spec.peak_flops_fp32 or 0.0
    te = np.array([_tensor_engine_ns(r, peak) for r in rows], float)
    bf16 = d - np.minimum(te, d) * (1 - 1 / speedup)
    forward = [r for r in rows if not r["backward"]]
    per_cast = 2 if has_backward else 1  # the cast and, with a backward, its gradient's
    each, casts_of, elements, fitted = _cast_costs(ctx, rows, per_cast)
    cast_ns = float(np.sum(each)) * per_cast
    # a bf16 model casts at its boundary only: the input in, the output out (and, with a
    # backward, the output's gradient back), each about a typical matmul input's cast
    model_cast_ns = float(np.median(each)) * (1 + per_cast) if len(each) else 0.0
    return Bf16Estimate(
        matmuls=len(rows),
        forward=len(forward),
        matmul_ns=int(d.sum()),
        bf16_matmul_ns=int(bf16.sum()),
        casts=len(elements) * per_cast,
        cast_ns=int(cast_ns),
        fitted=fitted,
        model_cast_ns=int(model_cast_ns),
        per_kernel=tuple(
            (int(r["id"]), round(float(b)), round(float(c)))
            for r, b, c in zip(rows, bf16, casts_of, strict=True)
        ),  # fmt: skip
    )


def _cast_costs(ctx: AnalysisContext, rows: list, per_cast: int) -> tuple:
    """Each forward matmul input's cast to bf16 (ns), the casts' time charged to each kernel,
    the inputs' element counts, and whether the casts' cost was fitted to the profile's
    elementwise kernels."""
    owner = [k for k, r in enumerate(rows) if not r["backward"] for _ in parse_shapes(r["shapes"])]
    elements = [prod(s) for r in rows if not r["backward"] for s in parse_shapes(r["shapes"])]
    cast_bytes = np.array(elements, float) * CAST_BYTES_PER_ELEMENT
    ew = _elementwise_fit(ctx)
    if ew is not None:
        each = ew[0] + ew[1] * cast_bytes
    else:  # no elementwise kernels to learn from: the bytes at the spec's HBM bandwidth
        bandwidth = ctx.manifest.spec.hbm_bytes_per_s or 0.0
        each = cast_bytes / bandwidth * 1e9 if bandwidth else cast_bytes * 0.0
    casts_of = np.zeros(len(rows))
    np.add.at(casts_of, np.array(owner, dtype=np.int64), np.asarray(each, float) * per_cast)
    return each, casts_of, elements, ew is not None

"""Engine utilization, MFU and MBU of a neuron profile's summary."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from ..vocab.engines import lane_order
from . import intervals
from .columns import exact_sum, group_sum
from .context import AnalysisContext
from .conventions import ENGINE_TRACKS, TENSOR_ENGINE_TRACK


@dataclass(frozen=True)
class EngineUtil:
    rank: int
    engine: str
    busy_ns: int
    utilization: float  # busy over the rank's profiled step time


def _rank_time(ctx: AnalysisContext) -> dict[int, int]:
    ctx.steps()
    return {
        int(r["rank"]): int(r["ns"])
        for r in ctx.rows("SELECT rank, sum(e - s) AS ns FROM steps_w GROUP BY rank")
    }


def engines(ctx: AnalysisContext) -> tuple[EngineUtil, ...]:
    """Per rank and engine (the DMA queues as one): busy time and its share of step time."""
    cols = ctx.cols
    track, tracks = cols.codes("track")
    # the DMA queues count as one engine, busy while any queue moves data
    dma_queue = cols.like("track", ("DMA%",))
    rows = cols.where("layer", ("device",)) & (
        cols.where("track", ENGINE_TRACKS) | (cols.where("kind", ("dma",)) & dma_queue)
    )
    engines = sorted({tracks[t] for t in np.unique(track[rows & ~dma_queue])})
    if (rows & dma_queue).any():
        engines = sorted({*engines, "DMA"})
    engine_of = np.full(len(tracks) + 1, -1, dtype=np.int64)  # track code -> engine index
    for code, name in enumerate(tracks):
        label = "DMA" if name.startswith("DMA") else name
        if label in engines:
            engine_of[code] = engines.index(label)
    at = np.flatnonzero(rows)
    rank = cols.ints("rank")[at]
    lane = (rank - int(rank.min() if len(at) else 0)) * len(engines) + engine_of[track[at]]
    first, s, e = intervals.merge_arrays(lane, cols.ints("start_ns")[at], cols.end()[at])
    keys, inverse = np.unique(lane[first], return_inverse=True)
    busy = group_sum(inverse, e - s, len(keys))
    lane_rank = rank[first[np.unique(inverse, return_index=True)[1]]]
    denom = _rank_time(ctx)
    out = []
    for i, k in enumerate(keys):
        r = int(lane_rank[i])
        out.append(
            EngineUtil(
                rank=r,
                engine=engines[int(k) % len(engines)],
                busy_ns=int(busy[i]),
                utilization=round(int(busy[i]) / denom[r], 6) if denom.get(r) else 0.0,
            )
        )
    return tuple(sorted(out, key=lambda u: (u.rank, lane_order(u.engine))))


def _in_steps(ctx: AnalysisContext) -> str:
    return "step IS NOT NULL" if ctx.has_steps else "TRUE"


def _step_rows(ctx: AnalysisContext) -> np.ndarray:
    """Device rows inside a step (every row when the profile has no steps)."""
    cols = ctx.cols
    rows = cols.where("layer", ("device",))
    return rows & cols.valid("step") if ctx.has_steps else rows


def mfu(ctx: AnalysisContext) -> float | None:
    """TensorE FLOP/s over the bf16 peak (the matmul kernels' FLOPs without instructions)."""
    peak = ctx.manifest.spec.peak_flops_bf16 or 0.0
    secs = ctx.total_step_ns / 1e9
    if peak <= 0 or secs <= 0:
        return None
    cols = ctx.cols
    te = _step_rows(ctx) & cols.where("kind", ("instruction",))
    te &= cols.where("track", (TENSOR_ENGINE_TRACK,))
    flops = exact_sum(cols.ints("flops")[te])
    if not flops:  # no engine instructions: the matmul kernels' FLOPs
        has_args = pc.is_valid(ctx.events["args"]).to_numpy(zero_copy_only=False)
        kernels = ctx.subset("ev_mm", _step_rows(ctx) & cols.where("kind", ("kernel",)) & has_args)
        row = ctx.one(
            f"""SELECT coalesce(sum(flops), 0) AS mm FROM {kernels}
            WHERE json_extract(args, '$.matmul') IS NOT NULL"""
        )
        flops = row.get("mm") or 0
    return float(flops) / secs / peak


def mbu(ctx: AnalysisContext) -> float | None:
    """The kernels' HBM bytes/s over the peak."""
    peak = ctx.manifest.spec.hbm_bytes_per_s or 0.0
    secs = ctx.total_step_ns / 1e9
    if peak <= 0 or secs <= 0:
        return None
    cols = ctx.cols
    rows = _step_rows(ctx) & cols.where("kind", ("kernel",))
    moved = exact_sum(cols.ints("bytes_read")[rows]) + exact_sum(cols.ints("bytes_written")[rows])
    return float(moved) / secs / peak

"""Links between Kineto events: runtime launches to device work, forward to backward ops."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..vocab.intervals import NONE, nearest
from .kineto_extract import Decoded
from .kineto_frames import row_index_type
from .kineto_kinds import phase_is


def launches(gpu_rows: np.ndarray, corr: pa.Array, is_dev: np.ndarray, n: int) -> np.ndarray:
    """For each row, the runtime row that launched it (same correlation id), or -1."""
    launch = np.full(n, NONE, dtype=row_index_type(n))
    c = pc.fill_null(corr, -1).to_numpy(zero_copy_only=False)
    rt = ~is_dev & (c >= 0)
    dv = is_dev & (c >= 0)
    if not rt.any() or not dv.any():
        return launch
    rt_rows, rt_corr = gpu_rows[rt], c[rt]
    order = np.argsort(rt_corr, kind="stable")
    sorted_corr = rt_corr[order]
    pos = np.clip(np.searchsorted(sorted_corr, c[dv]), 0, len(order) - 1)
    hit = sorted_corr[pos] == c[dv]
    launch[gpu_rows[dv][hit]] = rt_rows[order[pos[hit]]]
    return launch


@dataclass(frozen=True)
class FlowPoints:
    """The fwdbwd flow events (with an id), read out before the decoded columns are let go."""

    ts: np.ndarray  # unix ns
    is_start: np.ndarray  # ph "s" (else the flow's end)
    flow: np.ndarray  # code into the trace's distinct flow ids
    events: np.ndarray  # the points' event indices
    track: np.ndarray | None = None  # the host lane of the point's thread (-1: none)

    @staticmethod
    def of(d: Decoded, points: np.ndarray) -> FlowPoints:
        """The points' times and ids, read before the lanes are known (the events' times are
        let go as soon as the rows have theirs)."""
        points = points[d.id_code[points] >= 0]
        base = d.trace.baseTimeNanoseconds or 0
        return FlowPoints(
            d.ts.ns[points] + base, phase_is(d.ph[points], "s"), d.id_code[points], points
        )

    def on_lanes(self, lane_of: Callable[[np.ndarray], np.ndarray]) -> FlowPoints:
        """These points with their host lanes (`lane_of`: event indices -> lane codes)."""
        return replace(self, track=lane_of(self.events))


def fwdbwd(
    p: FlowPoints,
    ids: pa.Array,
    track_code: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    is_op: np.ndarray,
    flow_src: np.ndarray,
) -> dict[int, str]:
    """Link forward ops to their backward ops (fwdbwd flows): both get the forward op as flow
    source in `flow_src`; a row whose flow is taken keeps the Kineto flow id (of `ids`) for
    its args.

    A flow point binds to the innermost op on its thread that contains its time (Kineto puts it
    at the op's start): a searchsorted over ops sorted by (thread, start), then a climb to the
    enclosing op while the candidate ended before the point.
    """
    extra: dict[int, str] = {}
    op_rows = np.flatnonzero(is_op)
    if p.ts.size == 0 or op_rows.size == 0:
        return extra
    p_ts, p_track = p.ts, p.track
    assert p_track is not None, "the points' lanes (FlowPoints.on_lanes)"
    lo = min(int(start[op_rows].min()), int(p_ts.min()))
    span = max(int(start[op_rows].max()), int(p_ts.max())) - lo + 1
    if (int(track_code.max()) + 1) * span >= 2**62:
        return extra
    okey = track_code[op_rows].astype(np.int64) * span + (start[op_rows] - lo)
    order = np.argsort(okey, kind="stable")
    pos = np.searchsorted(okey[order], p_track * span + (p_ts - lo), side="right") - 1
    cand = np.where(pos >= 0, op_rows[order[np.clip(pos, 0, None)]], NONE)
    cand = np.where(track_code[np.clip(cand, 0, None)] == p_track, cand, NONE)
    op_anc = nearest(parent, is_op)
    while True:  # climb to the innermost op that still contains the point
        c = np.clip(cand, 0, None)
        out = (cand >= 0) & (start[c] + dur[c] < p_ts)
        if not out.any():
            break
        cand = np.where(out, op_anc[c], cand)
    code = p.flow
    src = np.full(len(ids), NONE, dtype=np.int64)
    dst = src.copy()
    is_s = p.is_start
    src[code[is_s]] = cand[is_s]
    dst[code[~is_s]] = cand[~is_s]
    for flow in np.flatnonzero((src >= 0) & (dst >= 0)).tolist():
        fwd, bwd = int(src[flow]), int(dst[flow])
        for row in (fwd, bwd):
            if flow_src[row] in (NONE, fwd):
                flow_src[row] = fwd
            else:
                extra[row] = ids[flow].as_py()
    return extra

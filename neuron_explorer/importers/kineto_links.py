"""Links between Kineto events: runtime launches to device work, forward to backward ops."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..vocab.intervals import NONE, nearest
from .kineto_extract import Decoded


def launches(gpu_rows: np.ndarray, corr: pa.Array, is_dev: np.ndarray, n: int) -> np.ndarray:
    """For each row, the runtime row that launched it (same correlation id), or -1."""
    launch = np.full(n, NONE, dtype=np.int64)
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


def fwdbwd(
    d: Decoded,
    points: np.ndarray,
    rows: np.ndarray,
    track_code: np.ndarray,
    point_track: np.ndarray,
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    is_op: np.ndarray,
    flow_src: np.ndarray,
) -> dict[int, str]:
    """Link forward ops to their backward ops (fwdbwd flows): both get the forward op as flow
    source in `flow_src`; a row whose flow is taken keeps the Kineto flow id for its args.

    A flow point binds to the innermost op on its thread that contains its time (Kineto puts it
    at the op's start): a searchsorted over ops sorted by (thread, start), then a climb to the
    enclosing op while the candidate ended before the point.
    """
    extra: dict[int, str] = {}
    op_rows = np.flatnonzero(is_op)
    keep = d.id_code[points] >= 0
    points, point_track = points[keep], point_track[keep]
    if points.size == 0 or op_rows.size == 0:
        return extra
    base = d.trace.baseTimeNanoseconds or 0
    p_ts = d.ts.ns[points] + base
    p_track = point_track  # the host lane of the point's thread (-1: none)
    lo = min(int(start[op_rows].min()), int(p_ts.min()))
    span = max(int(start[op_rows].max()), int(p_ts.max())) - lo + 1
    if (int(track_code.max()) + 1) * span >= 2**62:
        return extra
    okey = track_code[op_rows] * span + (start[op_rows] - lo)
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
    code = d.id_code[points]
    src = np.full(len(d.ids), NONE, dtype=np.int64)
    dst = src.copy()
    is_s = d.ph[points] == "s"
    src[code[is_s]] = cand[is_s]
    dst[code[~is_s]] = cand[~is_s]
    for flow in np.flatnonzero((src >= 0) & (dst >= 0)).tolist():
        fwd, bwd = int(src[flow]), int(dst[flow])
        for row in (fwd, bwd):
            if flow_src[row] in (NONE, fwd):
                flow_src[row] = fwd
            else:
                extra[row] = d.ids[flow].as_py()
    return extra

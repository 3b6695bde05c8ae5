"""Links between Kineto events: runtime launches to device work, forward to backward ops."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import kineto_decode as kd
from .nesting import NONE, nearest


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
    evs: list,
    phn: np.ndarray,
    points: np.ndarray,
    point_ts: np.ndarray,
    rows: np.ndarray,
    track: pa.Array,
    start: np.ndarray,
    dur: np.ndarray,
    parent: np.ndarray,
    is_op: np.ndarray,
    flow_src: np.ndarray,
) -> dict[int, str]:
    """Link forward ops to their backward ops (fwdbwd flows): both get the forward op as flow
    source in `flow_src`; a row whose flow is taken keeps the Kineto flow id for its args."""
    extra: dict[int, str] = {}
    op_rows = np.flatnonzero(is_op)
    if points.size == 0 or op_rows.size == 0:
        return extra
    p_track = kd.prefixed("thread ", kd.unquote(kd.raw_column([evs[i].tid for i in points])))
    codes = pc.dictionary_encode(
        pa.concat_arrays(
            [track.take(op_rows).cast(pa.large_string()), p_track.cast(pa.large_string())]
        )
    )
    codes = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    o_track, p_tr = codes[: op_rows.size], codes[op_rows.size :]
    p_ts = point_ts[points]
    lo = min(int(start[op_rows].min()), int(p_ts.min()))
    span = max(int(start[op_rows].max()), int(p_ts.max())) - lo + 1
    if (int(codes.max()) + 1) * span >= 2**62:
        return extra
    okey = o_track * span + (start[op_rows] - lo)
    order = np.argsort(okey, kind="stable")
    pos = np.searchsorted(okey[order], p_tr * span + (p_ts - lo), side="right") - 1
    cand = np.where(pos >= 0, op_rows[order[np.clip(pos, 0, None)]], NONE)
    op_anc = nearest(parent, is_op)
    for _ in range(64):  # climb to the innermost op that still contains the point
        c = np.clip(cand, 0, None)
        out = (cand >= 0) & (start[c] + dur[c] < p_ts)
        if not out.any():
            break
        cand = np.where(out, op_anc[c], cand)
    ids = kd.unquote(kd.raw_column([evs[i].id for i in points]))
    id_code = pc.dictionary_encode(ids).indices.to_numpy(zero_copy_only=False)
    id_code = np.asarray(id_code, dtype=np.int64)
    src = np.full(int(id_code.max()) + 1, NONE, dtype=np.int64)
    dst = src.copy()
    is_s = phn[points] == "s"
    src[id_code[is_s]] = cand[is_s]
    dst[id_code[~is_s]] = cand[~is_s]
    pairs = np.flatnonzero((src >= 0) & (dst >= 0))
    id_text = pc.dictionary_encode(ids).dictionary.to_pylist()
    for code in pairs.tolist():
        fwd, bwd = int(src[code]), int(dst[code])
        for row in (fwd, bwd):
            if flow_src[row] in (NONE, fwd):
                flow_src[row] = fwd
            else:
                extra[row] = id_text[code]
    return extra

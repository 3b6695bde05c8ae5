"""Interval arithmetic over columns with numpy: merging overlapping spans into disjoint ones per
lane, and measuring how much of a query window disjoint spans cover. Vectorised over all rows
(sorts and prefix sums), never a Python loop over events."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_LIMIT = 2**62  # shifted times must stay inside int64


def _codes(table: pa.Table, part: list[str]) -> np.ndarray:
    """One integer lane code per row from the partition columns (any types)."""
    code = np.zeros(table.num_rows, dtype=np.int64)
    for name in part:
        col = table[name]
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        enc = pc.dictionary_encode(col.combine_chunks())
        idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        code = code * (len(enc.dictionary) + 1) + idx
    return code


def merge(table: pa.Table, part: list[str]) -> pa.Table:
    """Merge the intervals [s, e) of `table` into disjoint ones per `part` lane; touching
    intervals join. Returns the part columns plus s and e, sorted by lane and s."""
    if table.num_rows == 0:
        return table.select([*part, "s", "e"])
    s = table["s"].to_numpy(zero_copy_only=False).astype(np.int64)
    e = table["e"].to_numpy(zero_copy_only=False).astype(np.int64)
    rows, out_s, out_e = merge_arrays(_codes(table, part), s, e)
    cols = {name: table[name].take(pa.array(rows)) for name in part}
    cols["s"] = pa.array(out_s)
    cols["e"] = pa.array(out_e)
    return pa.table(cols)


def merge_arrays(
    lane: np.ndarray, s: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge intervals [s, e) (int64 arrays) into disjoint ones per integer `lane`; touching
    intervals join. Returns, per merged interval sorted by lane and start, the index of a row of
    its lane, its start and its end."""
    n = len(s)
    if n == 0:
        return np.empty(0, dtype=np.int64), s[:0], e[:0]
    lane = lane.astype(np.int64) - int(lane.min())
    if lane.max() < 2**15:  # numpy sorts 16-bit keys by radix
        lane = lane.astype(np.int16)
    lo = int(s.min())
    span = int(max(e.max(), s.max())) - lo + 1
    if span * (int(lane.max()) + 1) >= _LIMIT:  # sparse lane codes: number them densely
        lane = np.unique(lane, return_inverse=True)[1]
        if span * (int(lane.max()) + 1) >= _LIMIT:
            raise OverflowError("intervals span too wide to merge in int64")
    # shift each lane into its own time range so one running max serves every lane
    shift = lane.astype(np.int64) * span - lo
    s2, e2 = s + shift, np.maximum(e, s) + shift
    # By start only: the order of equal starts changes neither the islands nor their ends.
    # Events come sorted by time, so grouping by lane first (a radix sort of small lane
    # numbers) leaves runs that the stable sort (timsort) of the starts finds in linear time.
    by_lane = np.argsort(lane, kind="stable")
    order = by_lane[np.argsort(s2[by_lane], kind="stable")]
    s2, e2 = s2[order], e2[order]
    run = np.maximum.accumulate(e2)
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    starts[1:] = s2[1:] > run[:-1]
    first = np.flatnonzero(starts)
    out_s, out_e = s2[first], np.maximum.reduceat(e2, first)
    rows = order[first]
    back = shift[rows]
    return rows, out_s - back, out_e - back


def _lanes(merged: pa.Table, part: list[str], windows: pa.Table, pad: int) -> tuple:
    """Lane codes, interval ends and window ends as int64 arrays, and the per-lane span (the
    time range plus `pad`) that lays the lanes end to end on one int64 axis."""
    keys = merged.select(part)
    code = _codes(pa.concat_tables([keys, windows.select(part).cast(keys.schema)]), part)
    mc, wc = code[: merged.num_rows], code[merged.num_rows :]
    s = merged["s"].to_numpy(zero_copy_only=False).astype(np.int64)
    e = merged["e"].to_numpy(zero_copy_only=False).astype(np.int64)
    ws = windows["ws"].to_numpy(zero_copy_only=False).astype(np.int64)
    we = windows["we"].to_numpy(zero_copy_only=False).astype(np.int64)
    lo = int(min(s.min(), ws.min()))
    span = int(max(e.max(), we.max())) - lo + pad
    if span * (int(code.max()) + 1) >= _LIMIT:
        raise OverflowError("intervals span too wide to measure in int64")
    return mc, wc, s, e, ws, we, lo, span


def covered(merged: pa.Table, part: list[str], windows: pa.Table) -> np.ndarray:
    """For each window (the part columns plus ws, we), the time inside it that the disjoint
    `merged` intervals of its lane cover: F(we) - F(ws), F(t) = covered time before t."""
    m = windows.num_rows
    if m == 0 or merged.num_rows == 0:
        return np.zeros(m, dtype=np.int64)
    mc, wc, s, e, ws, we, lo, span = _lanes(merged, part, windows, pad=1)
    key = mc * span + (s - lo)  # lanes laid end to end; intervals are disjoint in a lane
    order = np.argsort(key, kind="stable")
    key, mc, s, e = key[order], mc[order], s[order], e[order]
    length = e - s
    before = np.concatenate(([0], np.cumsum(length)))  # covered time before interval i

    def upto(t: np.ndarray) -> np.ndarray:
        """Covered time in each window's lane before time t."""
        first = np.searchsorted(key, wc * span, "left")  # the lane's first interval
        i = np.searchsorted(key, wc * span + (t - lo), "right") - 1
        valid = (i >= 0) & (i >= first)
        j = np.where(valid, i, 0)
        inside = np.clip(t - s[j], 0, length[j])
        return np.where(valid, before[j] - before[first] + inside, 0)

    return upto(we) - upto(ws)


def gaps(merged: pa.Table, part: list[str], windows: pa.Table, min_ns: int) -> pa.Table:
    """The stretches of at least `min_ns` inside each window (part columns plus ws, we) that
    the disjoint `merged` intervals of its lane leave uncovered: the window's part columns,
    ws, and each gap's start_ns and dur_ns. Windows whose lane has no interval are skipped."""
    empty = pa.table(
        {
            **{p: windows[p].slice(0, 0) for p in part},
            "ws": pa.array([], pa.int64()),
            "start_ns": pa.array([], pa.int64()),
            "dur_ns": pa.array([], pa.int64()),
        }
    )
    merged = merged.filter(pc.greater(merged["e"], merged["s"]))  # instants split no gap
    if windows.num_rows == 0 or merged.num_rows == 0:
        return empty
    mc, wc, s, e, ws, we, lo, span = _lanes(merged, part, windows, pad=2)
    order = np.argsort(mc * span + (s - lo), kind="stable")
    mc, s, e = mc[order], s[order], e[order]
    ks, ke = mc * span + (s - lo), mc * span + (e - lo)
    # idle stretches of each lane: before its first interval, between intervals, after its last
    new_lane = np.empty(len(mc), dtype=bool)
    new_lane[0] = True
    new_lane[1:] = mc[1:] != mc[:-1]
    last = np.empty(len(mc), dtype=bool)
    last[:-1] = new_lane[1:]
    last[-1] = True
    idle_s = np.concatenate([mc[new_lane] * span, ke])
    idle_e = np.concatenate([ks[new_lane], np.where(last, mc * span + span - 1, np.roll(ks, -1))])
    o = np.argsort(idle_s, kind="stable")
    idle_s, idle_e = idle_s[o], idle_e[o]
    has_lane = np.isin(wc, mc)
    kws, kwe = wc * span + (ws - lo), wc * span + (we - lo)
    first = np.searchsorted(idle_e, kws, "right")  # first stretch ending after the start
    stop = np.searchsorted(idle_s, kwe, "left")  # stretches starting before the end
    count = np.where(has_lane, np.maximum(stop - first, 0), 0)
    win = np.repeat(np.arange(len(ws)), count)
    idx = np.repeat(first, count) + (
        np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    )
    gs = np.maximum(idle_s[idx], kws[win])
    ge = np.minimum(idle_e[idx], kwe[win])
    keep = ge - gs >= min_ns
    win, gs, ge = win[keep], gs[keep], ge[keep]
    base = wc[win] * span - lo
    out = {p: windows[p].take(pa.array(win)) for p in part}
    out["ws"] = pa.array(ws[win])
    out["start_ns"] = pa.array(gs - base)
    out["dur_ns"] = pa.array(ge - gs)
    return pa.table(out)

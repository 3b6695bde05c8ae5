"""Interval algorithms over whole columns, declared once: nesting (each span's enclosing span
on its lane), the nearest marked ancestor, which span holds a time (steps), merging spans into
disjoint ones per lane, the time disjoint spans cover inside windows, and the gaps they leave.
The importers nest host events with them, capture links runtime calls to framework ops, analysis
measures busy and idle time, and the timeline draws nesting depth.

Vectorised with numpy (sorts, prefix sums, pointer jumping), never a Python loop per event but
in `innermost_parents`. numpy is imported where used, so the vocabulary imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

NONE = -1
_LIMIT = 2**62  # shifted times must stay inside int64


def nest(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Index of each interval's enclosing interval on the same track, or -1.

    The parent is the nearest earlier interval (in (start, longest first) order) that contains
    it; a span merely touching it (ending where an instant sits) does not. Spans that overlap
    without nesting (a record_function opened inside Python frames) never become parents of
    what they do not contain.

    Algorithm: "previous greater element" on the ends, by pointer jumping over whole columns
    (see _previous_container).
    """
    import numpy as np

    n = len(start)
    index = np.int32 if n < 2**31 else np.int64  # positions: half the memory below 2**31
    parent = np.full(n, NONE, dtype=index)
    if n == 0:
        return parent
    order = _track_start_order(track, start, end).astype(index)
    e = end[order]
    need = e + (e <= start[order])  # an instant needs a container that ends strictly after it
    j = _previous_container(e, need)
    del e, need
    t = track[order]
    found = (j >= 0) & (t[np.clip(j, 0, None)] == t)
    del t
    parent[order[found]] = order[j[found]]
    return parent


JUMP_ROUNDS = 256  # rounds grow with nesting depth; deeper input goes to the descent


def _previous_container(end: np.ndarray, need: np.ndarray) -> np.ndarray:
    """For each position i, the nearest j < i with end[j] >= need[i], or -1.

    Each position keeps a candidate j with every end between j and i below need[i]; while
    end[j] < need[i] it jumps to j's own candidate (those ends are below need[j] <= need[i],
    so nothing is skipped wrongly). Rounds follow the nesting depth; O(n) memory.
    """
    import numpy as np

    n = len(end)
    index = np.int32 if n < 2**31 else np.int64
    prev = np.arange(-1, n - 1, dtype=index)
    active = np.arange(n, dtype=index)
    for jump in range(JUMP_ROUNDS):
        if jump == 0:  # every candidate is i - 1: compared by slices, no gathers of n
            active = (np.flatnonzero(end[:-1] < need[1:]) + 1).astype(index)
        else:
            p = prev[active]
            active = active[(p >= 0) & (end[np.maximum(p, 0)] < need[active])]
        if not active.size:
            return prev
        prev[active] = prev[prev[active]]
    prev[active] = _descend(end, need, active, prev[active] + 1)
    return prev


def _descend(end: np.ndarray, need: np.ndarray, idx: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The same search for positions `idx`, each known to have no container in [pos, idx),
    by a binary descent over a sparse table of range maxima (log n arrays)."""
    import numpy as np

    n = len(end)
    levels = [end]
    while (1 << len(levels)) <= n:
        half = 1 << (len(levels) - 1)
        prev = levels[-1]
        cur = prev.copy()
        np.maximum(prev[: n - half], prev[half:], out=cur[: n - half])
        levels.append(cur)
    want = need[idx]
    for k in range(len(levels) - 1, -1, -1):
        cand = pos - (1 << k)
        skip = (cand >= 0) & (levels[k].take(cand, mode="clip") < want)
        pos = pos - skip * (1 << k)
    j = pos - 1
    return np.where((j >= 0) & (end[np.clip(j, 0, None)] >= want), j, NONE)


def _track_start_order(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Indices by (track, start, longest first), ties in index order (lexsort is stable);
    track and start packed into one key when they fit in int64."""
    import numpy as np

    lo, hi = int(start.min()), int(start.max())
    tracks = int(track.max()) + 1
    if track.min() >= 0 and (hi - lo + 1) * tracks < 2**62:
        key = track.astype(np.int64)  # made in place: one temporary column, not four
        key *= hi - lo + 1
        key -= lo  # before the starts: every partial sum stays within int64
        key += start
        return key_then_descending(key, end)
    return np.lexsort((-end, start, track))


def key_then_descending(key: np.ndarray, second: np.ndarray) -> np.ndarray:
    """np.lexsort((-second, key)): indices by key, ties by `second` descending, then in index
    order. A stable argsort of the key (timsort: the times come nearly in order) and a lexsort
    of the tied rows alone; lexsort sorts every row by both keys, ten times the time (a chunk
    of the 1 GB trace's 480,000 rows: 23 ties, 40 ms to 4)."""
    import numpy as np

    order = np.argsort(key, kind="stable")
    k = key[order]
    tie = k[1:] == k[:-1]
    if not tie.any():
        return order
    tied = np.zeros(len(order), bool)  # the places in `order` of every row that ties
    tied[1:] = tie
    tied[:-1] |= tie
    at = np.flatnonzero(tied)
    rows = order[at]  # each run of ties in index order (the sort is stable)
    order[at] = rows[np.lexsort((-second[rows], k[at]))]
    return order


def nearest(parent: np.ndarray, mask: np.ndarray, *, include_self: bool = False) -> np.ndarray:
    """For each event, the nearest ancestor (following `parent`) where `mask` is true, or -1
    (indices of `parent`'s dtype: int32 parents give an int32 answer, half the memory)."""
    import numpy as np

    n = len(parent)
    res = np.arange(n, dtype=parent.dtype) if include_self else parent.copy()
    active = np.flatnonzero(res >= 0)
    active = active[~mask[res[active]]]
    while active.size:
        res[active] = parent[res[active]]
        active = active[res[active] >= 0]
        active = active[~mask[res[active]]]
    return res


def containing(starts: np.ndarray, spans_start: np.ndarray, spans_end: np.ndarray) -> np.ndarray:
    """Index of the span (non-overlapping, any order) that contains each start, or -1."""
    import numpy as np

    if len(spans_start) == 0:
        return np.full(len(starts), NONE, dtype=np.int64)
    order = np.argsort(spans_start, kind="stable")
    ss, se = spans_start[order], spans_end[order]
    i = np.searchsorted(ss, starts, side="right") - 1
    ok = (i >= 0) & (starts < se[np.clip(i, 0, None)])
    return np.where(ok, order[np.clip(i, 0, None)], NONE)


def innermost_parents(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, is_parent: np.ndarray
) -> np.ndarray:
    """For each event, the index of the innermost event on the same track (among those with
    `is_parent`) whose [start, end] contains it, or -1. Ties in start put the longer first."""
    import numpy as np

    n = len(start)
    out = np.full(n, -1, dtype=np.int64)
    order = np.lexsort((~is_parent, -(end - start), start, track))
    stack: list[int] = []
    current = None
    for i in order.tolist():
        if track[i] != current:
            current, stack = track[i], []
        while stack and end[stack[-1]] < end[i]:
            stack.pop()
        # Skip open events that start later than this one (equal starts, shorter spans).
        if stack:
            out[i] = stack[-1] if stack[-1] != i else -1
        if is_parent[i]:
            stack.append(i)
    return out


def inside_spans(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, spans: dict[object, tuple]
) -> np.ndarray:
    """Whether each event lies within one of the (sorted starts, ends) spans of its track."""
    import numpy as np

    out = np.zeros(len(start), dtype=bool)
    for key, (s, e) in spans.items():
        rows = np.flatnonzero(track == key)
        if not len(rows) or not len(s):
            continue
        i = np.searchsorted(s, start[rows], side="right") - 1
        ok = i >= 0
        out[rows[ok]] = end[rows[ok]] <= e[i[ok]]
    return out


def merge_arrays(
    lane: np.ndarray, s: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge intervals [s, e) (int64 arrays) into disjoint ones per integer `lane`; touching
    intervals join. Returns, per merged interval sorted by lane and start, the index of a row of
    its lane, its start and its end."""
    import numpy as np

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


def depths(ids: np.ndarray, parents: np.ndarray, lanes: np.ndarray, limit: int = 64) -> np.ndarray:
    """Nesting depth of each event: its parents (by id) on the same lane, resolved level by
    level; deeper nesting than `limit` counts as `limit`."""
    import numpy as np

    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    pidx = _parent_rows(ids, parents)
    pidx = np.where((pidx >= 0) & (lanes[np.maximum(pidx, 0)] == lanes), pidx, -1)
    depth = np.zeros(n, dtype=np.int32)
    # only the rows whose chain goes on are followed: few events nest deep
    active = np.flatnonzero(pidx >= 0)
    cur = pidx[active]
    for _ in range(limit):
        if not len(active):
            break
        depth[active] += 1
        cur = pidx[cur]
        keep = cur >= 0
        active, cur = active[keep], cur[keep]
    return depth


def _parent_rows(ids: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """The row of each event's parent id among `ids` (-1: none or not there). Ids within a few
    times the row count of each other are looked up in one array (a profile's ids count its
    events), others by binary search."""
    import numpy as np

    n = len(ids)
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo <= 4 * n + (1 << 20) and n < 2**31:  # rows fit in int32: half the memory
        row = np.full(hi - lo + 1, -1, dtype=np.int32)
        rows = np.arange(n, dtype=np.int32)
        row[ids - lo] = rows
        if np.array_equal(row[ids - lo], rows):  # unique ids (else the search below)
            inside = (parents >= 0) & (parents >= lo) & (parents <= hi)
            return np.where(inside, row[np.clip(parents - lo, 0, hi - lo)], -1)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    pos = np.clip(np.searchsorted(sorted_ids, parents), 0, n - 1)
    return np.where((parents >= 0) & (sorted_ids[pos] == parents), order[pos], -1)


def step_of(times: np.ndarray, step_start: np.ndarray, step_end: np.ndarray, step_num: np.ndarray):
    """The step number whose [start, end) holds each time, or -1 (steps do not overlap)."""
    import numpy as np

    i = containing(times, step_start, step_end)
    return np.where(i >= 0, step_num[np.clip(i, 0, None)], NONE) if len(step_num) else i


def _span(lane: np.ndarray, s: np.ndarray, e: np.ndarray, ws: np.ndarray, we: np.ndarray,
          pad: int) -> tuple[int, int]:  # fmt: skip
    """(lo, span): the per-lane time range plus `pad` that lays the lanes end to end on one int64
    axis (lane * span + t - lo)."""
    lo = int(min(s.min(), ws.min()))
    span = int(max(e.max(), we.max())) - lo + pad
    if span * (int(lane.max()) + 1) >= _LIMIT:
        raise OverflowError("intervals span too wide to measure in int64")
    return lo, span


def covered(
    lane: np.ndarray, s: np.ndarray, e: np.ndarray, wlane: np.ndarray, ws: np.ndarray,
    we: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """For each window [ws, we) of lane `wlane`, the time inside it that the disjoint intervals
    [s, e) of that lane cover: F(we) - F(ws), F(t) = covered time before t."""
    import numpy as np

    if len(ws) == 0 or len(s) == 0:
        return np.zeros(len(ws), dtype=np.int64)
    lo, span = _span(np.concatenate([lane, wlane]), s, e, ws, we, pad=1)
    key = lane * span + (s - lo)  # lanes laid end to end; intervals are disjoint in a lane
    order = np.argsort(key, kind="stable")
    key, s, e = key[order], s[order], e[order]
    length = e - s
    before = np.concatenate(([0], np.cumsum(length)))  # covered time before interval i

    def upto(t: np.ndarray) -> np.ndarray:
        """Covered time in each window's lane before time t."""
        first = np.searchsorted(key, wlane * span, "left")  # the lane's first interval
        i = np.searchsorted(key, wlane * span + (t - lo), "right") - 1
        valid = (i >= 0) & (i >= first)
        j = np.where(valid, i, 0)
        inside = np.clip(t - s[j], 0, length[j])
        return np.where(valid, before[j] - before[first] + inside, 0)

    return upto(we) - upto(ws)


def gaps(
    lane: np.ndarray, s: np.ndarray, e: np.ndarray, wlane: np.ndarray, ws: np.ndarray,
    we: np.ndarray, min_ns: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The stretches of at least `min_ns` inside each window [ws, we) of lane `wlane` that the
    disjoint intervals [s, e) (none empty) of that lane leave uncovered: per gap, its window's
    index, start and duration. Windows whose lane has no interval have none."""
    import numpy as np

    if len(ws) == 0 or len(s) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, span = _span(np.concatenate([lane, wlane]), s, e, ws, we, pad=2)
    order = np.argsort(lane * span + (s - lo), kind="stable")
    mc, s, e = lane[order], s[order], e[order]
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
    has_lane = np.isin(wlane, mc)
    kws, kwe = wlane * span + (ws - lo), wlane * span + (we - lo)
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
    base = wlane[win] * span - lo
    return win, gs - base, ge - gs

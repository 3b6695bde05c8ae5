"""Vectorised interval logic for the importers: host nesting (parent_id), nearest ancestor of a
kind, and step containment, with numpy over whole columns instead of a loop per event."""

from __future__ import annotations

import numpy as np

NONE = -1


def nest(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Index of each interval's enclosing interval on the same track, or -1.

    The parent is the nearest earlier interval (in (start, longest first) order) that contains
    it; a span merely touching it (ending where an instant sits) does not. Spans that overlap
    without nesting (a record_function opened inside Python frames) never become parents of
    what they do not contain.

    Algorithm: "previous greater element" on the ends, by pointer jumping over whole columns
    (see _previous_container).
    """
    n = len(start)
    parent = np.full(n, NONE, dtype=np.int64)
    if n == 0:
        return parent
    order = _track_start_order(track, start, end)
    t, s, e = track[order], start[order], end[order]
    need = e + (e <= s)  # an instant needs a container that ends strictly after it
    j = _previous_container(e, need)
    jj = np.clip(j, 0, None)
    found = (j >= 0) & (t[jj] == t)
    parent[order[found]] = order[j[found]]
    return parent


JUMP_ROUNDS = 256  # rounds grow with nesting depth; deeper input goes to the descent


def _previous_container(end: np.ndarray, need: np.ndarray) -> np.ndarray:
    """For each position i, the nearest j < i with end[j] >= need[i], or -1.

    Each position keeps a candidate j with every end between j and i below need[i]; while
    end[j] < need[i] it jumps to j's own candidate (those ends are below need[j] <= need[i],
    so nothing is skipped wrongly). Rounds follow the nesting depth; O(n) memory.
    """
    n = len(end)
    prev = np.arange(-1, n - 1, dtype=np.int64)
    active = np.arange(n, dtype=np.int64)
    for _ in range(JUMP_ROUNDS):
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
    lo, hi = int(start.min()), int(start.max())
    tracks = int(track.max()) + 1
    if track.min() >= 0 and (hi - lo + 1) * tracks < 2**62:
        return np.lexsort((-end, track.astype(np.int64) * (hi - lo + 1) + (start - lo)))
    return np.lexsort((-end, start, track))


def nearest(parent: np.ndarray, mask: np.ndarray, *, include_self: bool = False) -> np.ndarray:
    """For each event, the nearest ancestor (following `parent`) where `mask` is true, or -1."""
    n = len(parent)
    res = np.arange(n, dtype=np.int64) if include_self else parent.copy()
    active = np.flatnonzero(res >= 0)
    active = active[~mask[res[active]]]
    while active.size:
        res[active] = parent[res[active]]
        active = active[res[active] >= 0]
        active = active[~mask[res[active]]]
    return res


def containing(starts: np.ndarray, spans_start: np.ndarray, spans_end: np.ndarray) -> np.ndarray:
    """Index of the span (non-overlapping, any order) that contains each start, or -1."""
    if len(spans_start) == 0:
        return np.full(len(starts), NONE, dtype=np.int64)
    order = np.argsort(spans_start, kind="stable")
    ss, se = spans_start[order], spans_end[order]
    i = np.searchsorted(ss, starts, side="right") - 1
    ok = (i >= 0) & (starts < se[np.clip(i, 0, None)])
    return np.where(ok, order[np.clip(i, 0, None)], NONE)

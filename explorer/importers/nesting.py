"""Vectorised interval logic for the importers: host nesting (parent_id), nearest ancestor of a
kind, and step containment, with numpy over whole columns instead of a loop per event."""

from __future__ import annotations

import numpy as np

NONE = -1


def nest(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Index of each interval's enclosing interval on the same track, or -1.

    Algorithm: sort by (track, start, longest first); a sweep over start and end boundaries gives
    each interval's depth (how many intervals are open when it starts); its parent is the last
    interval before it, in that order, one level up. Spans that overlap without nesting (clock
    rounding) get the parent only when it still contains their start.
    """
    n = len(start)
    parent = np.full(n, NONE, dtype=np.int64)
    if n == 0:
        return parent
    order = np.lexsort((np.arange(n), -end, start, track))
    t, s, e = track[order], start[order], end[order]
    pos = np.arange(n, dtype=np.int64)
    zero = e <= s
    # Boundaries: an end sorts before a start at the same time (touching spans do not nest),
    # except a zero-length span's end, which sorts right after its own start.
    b_track = np.concatenate([t, t])
    b_time = np.concatenate([s, np.maximum(e, s)])
    b_cls = np.concatenate([np.ones(n, np.int8), np.where(zero, 1, 0).astype(np.int8)])
    b_tie = np.concatenate([pos * 2, pos * 2 + 1])
    b_delta = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    b_order = np.lexsort((b_tie, b_cls, b_time, b_track))
    # every track's deltas sum to zero, so a global running sum is each track's own count
    open_after = np.cumsum(b_delta[b_order])
    depth_at = np.empty(2 * n, dtype=np.int64)
    depth_at[b_order] = open_after
    depth = depth_at[:n] - 1  # open intervals before this one starts
    # parent: last earlier interval on the track at depth - 1
    max_depth = int(depth.max()) + 2
    group = t.astype(np.int64) * max_depth + depth
    key = group * n + pos
    by_key = np.argsort(key, kind="stable")
    sorted_key = key[by_key]
    want = (group - 1) * n + pos
    hit = np.searchsorted(sorted_key, want, side="left") - 1
    ok = (depth > 0) & (hit >= 0)
    cand = by_key[np.clip(hit, 0, n - 1)]
    ok &= sorted_key[np.clip(hit, 0, n - 1)] // n == group - 1
    ok &= (s[cand] <= s) & ((e[cand] > s) | ((e[cand] == s) & zero))
    parent[order[ok]] = order[cand[ok]]
    return parent


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

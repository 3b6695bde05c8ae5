"""Interval helpers for the merge: innermost enclosing event per track, and step membership."""

from __future__ import annotations

import numpy as np


def innermost_parents(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, is_parent: np.ndarray
) -> np.ndarray:
    """For each event, the index of the innermost event on the same track (among those with
    `is_parent`) whose [start, end] contains it, or -1. Ties in start put the longer first."""
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


def step_of(times: np.ndarray, step_start: np.ndarray, step_end: np.ndarray, step_num: np.ndarray):
    """The step whose [start, end) holds each time, or -1 (steps do not overlap)."""
    if not len(step_start):
        return np.full(len(times), -1, dtype=np.int64)
    order = np.argsort(step_start)
    s, e, k = step_start[order], step_end[order], step_num[order]
    i = np.searchsorted(s, times, side="right") - 1
    ic = np.maximum(i, 0)
    inside = (i >= 0) & (times < e[ic])
    return np.where(inside, k[ic], -1)


def inside_spans(
    track: np.ndarray, start: np.ndarray, end: np.ndarray, spans: dict[object, tuple]
) -> np.ndarray:
    """Whether each event lies within one of the (sorted starts, ends) spans of its track."""
    out = np.zeros(len(start), dtype=bool)
    for key, (s, e) in spans.items():
        rows = np.flatnonzero(track == key)
        if not len(rows) or not len(s):
            continue
        i = np.searchsorted(s, start[rows], side="right") - 1
        ok = i >= 0
        out[rows[ok]] = end[rows[ok]] <= e[i[ok]]
    return out

"""One clock (DESIGN.md): the host timeline with the simulator's own work cut out.

Algorithm: every call into the backend runtime is a `Cut` [start, end) on the real clock that
spent `real_ns` inside the backend's Python code and CPU payload, and whose modeled host cost
(a launch, a compile, a copy, a sync's wait for the device) is `model_ns`. Overlapping cuts
(nested calls, or calls from two threads at once) are merged first. The mapping from real to
modeled time is then piecewise linear and non-decreasing: before a cut, time moves by the sum of
(real_ns - model_ns) of all earlier cuts; inside a cut, the cut's real span is scaled to
(span - real_ns + model_ns). Every host event's start and end go through the same mapping, so
nesting is kept, ops shrink by the simulator time inside them, and later events shift earlier.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Cut:
    """One runtime call on the real clock: its span, time spent inside the backend, and the
    modeled host cost that replaces that time."""

    start_ns: int
    end_ns: int
    real_ns: int
    model_ns: int


def merge_cuts(cuts: Iterable[Cut]) -> list[Cut]:
    """Sort cuts and merge overlapping ones; a merged cut never removes more than its span."""
    merged: list[Cut] = []
    for c in sorted(cuts, key=lambda c: (c.start_ns, -c.end_ns)):
        if c.end_ns < c.start_ns:
            continue
        if merged and c.start_ns < merged[-1].end_ns:
            last = merged[-1]
            end = max(last.end_ns, c.end_ns)
            inside = c.end_ns <= last.end_ns
            # A call nested in another is already part of the outer call's real time.
            real = last.real_ns if inside else last.real_ns + c.real_ns
            model = last.model_ns if inside else last.model_ns + c.model_ns
            merged[-1] = Cut(last.start_ns, end, min(real, end - last.start_ns), model)
        else:
            real = min(max(c.real_ns, 0), c.end_ns - c.start_ns)
            merged.append(Cut(c.start_ns, c.end_ns, real, max(c.model_ns, 0)))
    return merged


class HostClock:
    """Maps real host times (ns, any origin shared with the cuts) to the modeled host clock."""

    def __init__(self, cuts: Iterable[Cut]) -> None:
        merged = merge_cuts(cuts)
        self.starts = np.array([c.start_ns for c in merged], dtype=np.int64)
        self.ends = np.array([c.end_ns for c in merged], dtype=np.int64)
        spans = self.ends - self.starts
        new_spans = spans - np.array([c.real_ns - c.model_ns for c in merged], dtype=np.int64)
        self.new_spans = np.maximum(new_spans, 0)
        # Time removed by all cuts up to and including cut i.
        self.removed = np.cumsum(spans - self.new_spans)

    @property
    def total_removed_ns(self) -> int:
        return int(self.removed[-1]) if len(self.removed) else 0

    def map(self, t: np.ndarray | Iterable[int]) -> np.ndarray:
        """Modeled time of each real time in `t` (int64 array in, int64 array out)."""
        t = np.asarray(t, dtype=np.int64)
        if not len(self.starts):
            return t.copy()
        i = np.searchsorted(self.starts, t, side="right") - 1
        before = np.where(i > 0, self.removed[np.maximum(i - 1, 0)], 0)
        before = np.where(i >= 0, before, 0)
        ic = np.maximum(i, 0)
        start, end = self.starts[ic], self.ends[ic]
        span = np.maximum(end - start, 1)
        inside = (i >= 0) & (t < end)
        ratio = self.new_spans[ic] / span  # float: (t - start) * new_span overflows int64
        scaled = start - before + np.round((t - start) * ratio).astype(np.int64)
        after = t - np.where(i >= 0, self.removed[ic], 0)
        return np.where(inside, scaled, after).astype(np.int64)

    def map_one(self, t: int) -> int:
        return int(self.map(np.array([t]))[0])

"""One clock (docs/architecture.md): the host timeline with the simulator's own work cut out.

The neuron runtime keeps a running total `cut` = (real time spent inside the backend minus the
modeled host cost), summed over every runtime call so far; its modeled clock is `real - cut`
and device work is placed on that clock. Each recorded call gives its real span [start, end],
the total before it (`cut_before_ns`) and its modeled cost, hence two anchor points:
start -> start - cut_before and end -> start - cut_before + model_ns. When the running cut grew
by more than the call's own real-minus-modeled time before the next call (the op's return:
the result's unboxing and autograd's bookkeeping up to the end of torch's record of the op,
measured exactly with the C++ guard, or the calibrated round trip with the Python guard;
runtime/hostcost.py, accounted before the next op's span), a third anchor takes that much
real time right after the span, up to the next call, to the same modeled instant, so each
op's event keeps its modeled cost instead of the round trip being spread thin over whatever
user code runs between the two. (With the C++ guard a call's span itself starts where torch's
record of the op starts, so the argument boxing before `__torch_dispatch__` is inside it.)

Algorithm: collect the anchors of all calls in the window, sort them by real time, force the
modeled values to be non-decreasing (a call nested in or overlapping another), and map any real
time by linear interpolation between anchors, with slope 1 before the first and after the last.
Between calls that is exactly `real - cut`; inside a call, its real span shrinks to its modeled
cost. All host events go through the same non-decreasing map, so nesting and order are kept.
Results are relative: `cut0` (the total before the window) is added back, so time before the
first call is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Call:
    """One runtime call on the real clock: its span, the running cut before it, and the
    modeled host cost that replaces its real time."""

    start_ns: int
    end_ns: int
    model_ns: int
    cut_before_ns: int


class HostClock:
    """Maps real host times (ns, same origin as the calls) to the modeled host clock."""

    def __init__(self, calls: Iterable[Call], cut0: int | None = None) -> None:
        calls = sorted(calls, key=lambda c: (c.start_ns, c.end_ns))
        if cut0 is None:
            cut0 = calls[0].cut_before_ns if calls else 0
        self.cut0 = cut0  # the runtime's cut total when the window began
        real, modeled = [], []
        for i, c in enumerate(calls):
            m0 = c.start_ns - (c.cut_before_ns - self.cut0)
            m1 = m0 + max(c.model_ns, 0)
            real += [c.start_ns, max(c.end_ns, c.start_ns)]
            modeled += [m0, m1]
            after = _cut_after(c, calls[i + 1]) if i + 1 < len(calls) else 0
            if after:  # cut right where torch returns, not spread over the gap to the next call
                real.append(c.end_ns + after)
                modeled.append(m1)
        r = np.array(real, dtype=np.int64)
        m = np.array(modeled, dtype=np.int64)
        order = np.lexsort((m, r))
        # Equal real times stay as a step (a zero-length call inserts its whole cost there);
        # np.interp takes the later anchor at the step itself.
        self.real = r[order]
        self.modeled = np.maximum.accumulate(m[order]) if len(m) else m

    @property
    def total_removed_ns(self) -> int:
        """Real time removed from the host timeline, minus the modeled time put in."""
        if not len(self.real):
            return 0
        return int(self.real[-1] - self.modeled[-1])

    def map(self, t: np.ndarray | Iterable[int]) -> np.ndarray:
        """Modeled time of each real time in `t` (int64 array in, int64 array out)."""
        t = np.asarray(t, dtype=np.int64)
        if not len(self.real):
            return t.copy()
        r, m = self.real, self.modeled
        # Interpolate on offsets from the first anchor: small numbers, exact in float64.
        x, base = (t - r[0]).astype(np.float64), r[0]
        inner = np.interp(x, (r - base).astype(np.float64), (m - base).astype(np.float64))
        out = np.round(inner).astype(np.int64) + base
        out = np.where(t < r[0], t - (r[0] - m[0]), out)
        return np.where(t > r[-1], t - (r[-1] - m[-1]), out)


def _cut_after(call: Call, nxt: Call) -> int:
    """Real time cut after `call` beyond its span: the running cut grew by more than the
    call's own real-minus-modeled time (the op's return, runtime/hostcost.py, accounted before
    the next span). Bounded by the gap to the next call; 0 when the two overlap (calls on two
    threads)."""
    own = (call.end_ns - call.start_ns) - max(call.model_ns, 0)
    extra = (nxt.cut_before_ns - call.cut_before_ns) - own
    gap = nxt.start_ns - call.end_ns
    return min(extra, gap) if extra > 0 and gap > 0 else 0

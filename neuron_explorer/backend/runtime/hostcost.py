"""The wrapper's cost outside the runtime's span, measured once, so the host clock can cut it.

The recorded span of an op starts at `dispatch.dispatch` and ends when the runtime returns.
Around it, torch does work for every Python tensor subclass that a real device's C++ backend
never pays: boxing the arguments into Python objects, calling `__torch_dispatch__`, unboxing
the result into the wrapper (issue 14 saw view ops at 30-42 us on the modeled host timeline
against about 6 us on the plain CPU). With the C++ guard it is measured exactly, per op, from
torch's own record of each op (below: `exact`). Without it (the Python guard, no compiler)
Python cannot time that round trip per op, so it is
measured once per process, the first time an op is recorded: a metadata op (`view`) on a small
neuron tensor, minus the time inside `dispatch.dispatch` for the same call, minus the same op
on its CPU payload. Each recorded op's span is then taken to start that much earlier, and cut
with the rest; what stays on the host clock is what the plain CPU op costs (its C++ dispatch
and autograd), plus the modeled runtime cost. The loop's figure is a floor, raised from the
gaps the recording itself sees (refit, below).

Calibration runs under the profiler that is recording, with record functions on, because that
is what each recorded op pays: the `PythonSubclass` record function torch adds around a
subclass's op and the profiler's work on the boxed call are the wrapper's too (calibrated with
record functions off, the cut left ~6 us of a view's round trip on the host clock: issue 14's
table in benchmarks/README.md). The plain CPU view it subtracts is profiled alike, so what the
CPU pays under the profiler stays. It runs inside the first recorded op's span, so its time is
cut with that span and its own trace events are dropped at merge (capture/host.py drops what
lies inside a runtime call or a cut); it takes the unrecorded dispatch path (nothing reaches
the runtime's events) and a few milliseconds. A second figure is measured on tensors that
require grad: autograd's view tracking of a Python subclass costs ~11 us more per op where the
CPU's costs 0.6 us, and a C++ backend's tensors pay the CPU's. The smallest of several rounds
is used, so a burst of load on the machine does not inflate it (load can only shrink what is
cut: the cut never exceeds a quiet machine's overhead).
"""

from __future__ import annotations

import ctypes
import threading
import time

import torch
from torch.autograd import profiler as _prof
from torch.utils._python_dispatch import _disable_current_modes

OUTSIDE_NS: int | None = None  # set by calibrate(); None until the first recorded op
OUTSIDE_GRAD_NS = 0  # the same for an op that records grad (an input requires grad)
ROUNDS, CALLS = 15, 20
# The loop's figures are a floor: in a real model the round trip is larger than the loop's
# (GPT-2: a view's 16-18 us outside its span against 7-9 us, benchmarks/README.md), so the
# runtime also samples, per recorded op that records no grad, the real gap since the last call
# ended (record.py's _calibrated: GAPS), and every BATCH gaps refit() raises OUTSIDE_NS to the
# sample's low percentile minus what the plain CPU pays around a trivial op (CPU_NS, the
# calibrated CPU view), and OUTSIDE_GRAD_NS by as much (autograd's extra stays the loop's).
# An in-place op returns its input's wrapper, no new one: its round trip is the short one
# (GPT-2's add_: 7 us outside its span against a view's 18), so it cuts at most LOOP_NS.
BATCH, PERCENTILE = 256, 10
GAPS: list[int] = []  # gaps before ops recording no grad since the last refit (cleared, never
# rebound: record.py binds it once)
LOOP_NS = LOOP_GRAD_NS = CPU_NS = 0  # the calibration loop's figures
_lock = threading.Lock()


# The exact round trip (runtime/guard.cpp, when the C++ guard is loaded): per thread, the start
# of the latest FUNCTION record function (torch opens one per dispatcher call while a profiler
# records, before autograd and the subclass's Python dispatch) and the end of the one record
# the runtime watches (the previous op's). Each recorded op then cuts exactly its own round
# trip: its span starts at its record's start, not at t0 (autograd, the argument boxing, the
# dispatch into Python are cut with the span), and the previous op's record end minus that
# op's return (the result's unboxing, autograd's view tracking) is cut right after that op's
# span. No calibration, no refit, no dependence on load; the Python guard (no compiler) keeps
# the calibrated figures above.
# The same slots hold this thread's FREE: what the wrapper's frees outside every record took
# beyond the modeled free since the last op (guard.cpp times each from the wrapper type's
# tp_finalize to the end of torch's base tp_dealloc), cut with that op's return.
START, START_ID, WATCH, WATCH_END, FREE = range(5)  # the fields Python reads of one thread's
ENTRY_AT, QUEUED = 7, 8  # slots (the sixth and seventh, the open records and the capture, are
SLOTS = 9  # guard.cpp's own, as is a tenth not mapped)
# The simulating machine's preemptions and stalls (issue 27): with the C++ guard each thread's
# voluntary context switches, CPU time and run-queue delay (Linux's /proc/thread-self/schedstat)
# are read where the previous op's return ends and where the next op enters (guard.cpp); QUEUED
# is what the thread spent off its own work between the two (the real time less its CPU time
# where it did not block, else the run-queue delay alone), which the next op cuts with that
# return, never more than the real time the clock keeps between them (so a preemption inside a
# span, a return or a garbage collection, cut already, is not cut twice). QUEUED_NS sums the
# cuts of this process (handoff.py adds the caller's stretch before a backward); the manifest
# gets a capture's part (captured_run_queue).
RUN_QUEUE_FILE = "/proc/thread-self/schedstat"
QUEUED_NS = [0]  # run-queue delay and stalls cut so far (record.py binds the list once)
_queued_at_resume = 0  # QUEUED_NS when this capture's first op turned the callback on
_queued_captured = 0  # what the last capture cut, set when it was drained
NATIVE: ctypes.CDLL | None = None  # guard.native, set at registration (_registration.py)
FREES = False  # the wrapper's frees are timed (guard.watch_frees, at registration)
EXACT = False  # the exact round trip is measured (the C++ guard is loaded)
ON = False  # its record-function callback is on (a capture's first op to the drain)
THREAD = threading.local()  # .rt: this thread's slots (ctypes int64 array) or None


def thread_slots():
    """This thread's round-trip slots (ctypes array of SLOTS int64 at the C++ thread_local), or None
    with the Python guard; turns the callback on. Stored in THREAD.rt (read once per op)."""
    global EXACT
    lib = NATIVE
    rt = None
    if lib is not None:
        rt = (ctypes.c_int64 * SLOTS).from_address(lib.neuron_round_trip_slot())
        EXACT = True
        if not ON:  # else on already: autograd's device thread has it with the caller's state
            resume(rt)
    THREAD.rt = rt
    return rt


def resume(rt=None) -> None:
    """Turn the record-function callback on, on this thread (the first recorded op of a
    capture: added after the profiler's own, it runs after it; autograd's device thread gets
    it with the caller's thread-local state)."""
    global ON, _queued_at_resume, _queued_captured
    if NATIVE is not None:
        if not ON:
            _queued_at_resume, _queued_captured = QUEUED_NS[0], 0
        if FREES and not ON:
            from neuron_explorer.backend.runtime import model

            NATIVE.neuron_free_cost(model.spec().runtime.free_ns)
        NATIVE.neuron_round_trip(1)  # added anew on this thread: after the profiler's
        ON = True
        if rt is not None:  # what the slots hold is from before: no record of this capture
            rt[START] = 0  # (unrecorded ops after an undrained capture still wrote starts)
            rt[WATCH] = 0  # a record left watched when the callback went off never ends
            rt[FREE] = 0  # frees before this capture's first op
            rt[ENTRY_AT] = 0  # the delay since the last op of the previous capture


def pause() -> None:
    """Turn it off (the runtime's events are drained or cleared: the capture is over), so
    unrecorded ops build no record functions and the next capture adds it after its
    profiler's."""
    global ON, _queued_captured
    if NATIVE is not None and ON:
        NATIVE.neuron_round_trip(0)
        ON = False
        _queued_captured = QUEUED_NS[0] - _queued_at_resume


def captured_run_queue() -> dict[str, object]:
    """For the manifest: the run-queue delay and CPU stalls the last drained capture cut from
    the host clock (`cut_ns`, all threads of this process) and where it was read, or why
    nothing was."""
    import os

    if not EXACT:
        source = "none: the Python guard (no compiler) reads no run-queue delay"
    elif not os.access(RUN_QUEUE_FILE, os.R_OK):
        source = f"none: no {RUN_QUEUE_FILE} (not Linux): preemptions stay on the host clock"
    else:
        source = RUN_QUEUE_FILE
    return {"cut_ns": _queued_captured, "source": source}


def exact(rt, t0: int, last_end: int) -> tuple[int, int]:
    """(the previous op's return to cut, where this op's span starts) for the runtime call
    entered at t0; watches this op's record. The span starts at its record's start (torch's
    dispatcher entry: autograd, the argument boxing and the call into Python are inside it,
    cut with the span); the previous op's return is its record's end minus last_end (its
    span's end), cut right after that span (capture/clock.py). A record begun before the last
    call ended is not this op's (the op came by redispatch, a thread's first op, a capture's
    first): the span starts at t0. An op entered while the previous op's record is still open
    runs inside it (autograd saving a result calls `detach` on it): all the real time since
    the previous span is that op's return, cut, and the enclosing record stays watched. The
    thread's time off its CPU between that return and this op's entry is cut with the return
    (QUEUED, above). record.dispatch_recorded inlines this."""
    s = rt[START]
    if not (last_end < s <= t0):
        if not s:  # this thread's first, or a newer profiler's callback runs after ours
            resume(rt)
        s = t0
    if rt[WATCH] and last_end:
        return s - last_end, s
    e = rt[WATCH_END]
    if s != t0:
        rt[WATCH] = rt[START_ID]
    o = e - last_end if last_end < e <= s else 0
    f = rt[FREE]
    if f:  # the frees since the previous op: cut with its return, never beyond this op's start
        rt[FREE] = 0
        o = min(o + f, s - last_end) if last_end else o
    q = rt[QUEUED]  # the time off its CPU between that return and this op's entry
    if q > 0 and last_end < e <= s and e < rt[ENTRY_AT] <= t0:
        q = min(q, s - last_end - o)  # never more than the stretch the clock keeps
        if q > 0:
            o += q
            QUEUED_NS[0] += q
    return o, s


def round_trip(t0: int) -> tuple[int, int]:
    """exact() for a call off record.py's hot path (a factory: torch calls our Python impl from
    its C++ dispatcher, under the factory's own record); (0, t0) with the Python guard."""
    from neuron_explorer.backend.runtime import model

    try:
        rt = THREAD.rt
    except AttributeError:
        rt = thread_slots()
    if rt is None:
        return 0, t0
    if not ON:
        resume(rt)
    return exact(rt, t0, model.last_end_ns)


def outside_ns() -> int:
    """The per-op wrapper overhead outside the runtime's span, in ns (calibrated on first use)."""
    return OUTSIDE_NS if OUTSIDE_NS is not None else calibrate()


def calibrate() -> int:
    """Measure OUTSIDE_NS now (once per process; later calls return the first measurement)."""
    global OUTSIDE_NS, OUTSIDE_GRAD_NS, LOOP_NS, LOOP_GRAD_NS
    with _lock:
        if OUTSIDE_NS is None:
            LOOP_NS, LOOP_GRAD_NS = _measure()
            OUTSIDE_NS, OUTSIDE_GRAD_NS = LOOP_NS, LOOP_GRAD_NS
    return OUTSIDE_NS


def refit() -> None:
    """Refit the figures from the BATCH gaps sampled since the last refit.

    A gap is the previous op's return, the user's code between the two and this op's call up
    to the runtime's span. Its low percentile is where the user's code is next to nothing
    (consecutive ops inside torch or the autograd engine), so what it holds beyond the CPU's
    own cost around a trivial op is the wrapper's. Only ops that record no grad are sampled:
    a forward op that records grad has the model's Python code before it nearly always. Never
    below the loop's figures; each op's cut stays capped at its own gap (record.py)."""
    global OUTSIDE_NS, OUTSIDE_GRAD_NS
    with _lock:
        if len(GAPS) < BATCH or OUTSIDE_NS is None:
            return
        plain = max(LOOP_NS, _low(GAPS) - CPU_NS)
        GAPS.clear()
        OUTSIDE_NS, OUTSIDE_GRAD_NS = plain, LOOP_GRAD_NS + (plain - LOOP_NS)


def _low(gaps: list[int]) -> int:
    """The PERCENTILE-th percentile of `gaps` (nearest rank; no numpy on the op path)."""
    ordered = sorted(gaps)
    return ordered[len(ordered) * PERCENTILE // 100]


def _per_call(*fns) -> list[int]:
    """Each function's time per call, the smallest of ROUNDS rounds; the rounds take turns, so
    each figure's quietest round is drawn from the whole calibration, not one burst of it."""
    best: list[int | None] = [None] * len(fns)
    for _ in range(ROUNDS):
        for k, fn in enumerate(fns):
            t = time.perf_counter_ns()
            for _ in range(CALLS):
                fn()
            dt = (time.perf_counter_ns() - t) // CALLS
            b = best[k]
            best[k] = dt if b is None else min(b, dt)
    return [b or 0 for b in best]


# The dispatcher's thread-local key sets as user code sees them (this module is imported when
# the device registers, outside any op). Calibration runs inside the first recorded op, where
# torch has excluded autograd (and more) for the op's redispatch: measured there, a view on a
# tensor that requires grad would skip autograd, which every real one pays.
_USER_KEYS = (
    torch._C._dispatch_tls_local_include_set(),
    torch._C._dispatch_tls_local_exclude_set(),
)


def _measure() -> tuple[int, int]:
    global CPU_NS
    recording = _prof._is_profiler_enabled
    _prof._is_profiler_enabled = False  # the unrecorded path: no runtime events
    try:
        with (
            # the first recorded op may come while dynamo traces with fake tensors (a compiled
            # model under the profiler): the probes are real tensors, measured outside any mode
            _disable_current_modes(),
            torch._C._ForceDispatchKeyGuard(*_USER_KEYS),
            torch.inference_mode(False),
            torch.enable_grad(),
        ):
            # both variants in the same rounds, so a burst of load falls on both alike
            t = _per_call(*_probes(False), *_probes(True))
    finally:
        _prof._is_profiler_enabled = recording
    plain = max(0, t[0] - t[1] - t[2])
    CPU_NS = t[2]
    return plain, max(plain, t[3] - t[4] - t[5])


def _probes(requires_grad: bool) -> tuple:
    """A neuron `view`, the time inside the runtime's dispatch for it, and the CPU `view`."""
    # the op path below this module: tensor.py holds the runtime's dispatch bound at
    # registration, so measuring it needs no import of the dispatch module above
    from neuron_explorer.backend import tensor
    from neuron_explorer.backend.tensor import NeuronTensor

    view = torch.ops.aten.view.default
    shape = [-1]
    cpu = torch.zeros(4, 4, requires_grad=requires_grad)
    dev = NeuronTensor(cpu.detach().clone())  # not memory-tracked: no memory event
    dev.requires_grad_(requires_grad)
    return (
        lambda: dev.view(shape),
        lambda: tensor._dispatch(view, (dev, shape), {}),
        lambda: cpu.view(shape),
    )

"""Autograd's hand-offs to and from its device thread: idle waits, cut from the host clock.

`loss.backward()` on neuron tensors runs the graph on autograd's device thread while the
calling thread waits; the CPU runs the same graph on the calling thread. So a neuron backward
has two hand-offs a CPU run never pays: the device thread waking up for the first node, and the
caller waking up once the graph is done. On a quiet host each costs tens of us; on a loaded one
(this project's 2-core CI, a shared workstation) the scheduler can take milliseconds, in which
neither thread runs: measured on a tiny GPT-2 step at load 6-10, 0.1-16 ms per hand-off, the
largest single excess of the modeled host step over the CPU's (issue 14).

Both waits are idle time of the simulator's own threads, so they are cut like the backend's
spans (a `cut` record, modeled 0), measured, not assumed: a window [caller enters the engine,
device thread's first op] and [graph task done, caller returns], each less the caller's own CPU
time over the whole call (computing dependencies, releasing the graph: real host work that
stays). The start is cut when the first op arrives (before its kernel is placed, so host and
device stay on one clock); the end when the caller returns, from the graph task's end or the
last runtime call after it, whichever is later (DDP's final callbacks, which wait for its
gradient all-reduces and copy the buckets, run after the one that marks the end). The caller's
CPU time is read with its thread's CPU clock (`time.pthread_getcpuclockid`); where that is
missing nothing is cut.

The caller's own stretches on either side (from its last op's return to the engine's entry,
and from its return to its next op) have no op of the caller's at one end, so an op's entry
does not bound them (guard.cpp, issue 27): with the C++ guard the caller's stretch is ended at
the entry (what it spent off its own work since its last op's return is cut there) and begun
anew at the return, as between two ops.
"""

from __future__ import annotations

import ctypes
import threading
import time

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import hostcost, model

_now = time.time_ns
_calls: list[_Call] = []  # backward calls in progress, innermost last (a hook may nest one)
_orig = None


class _Call:
    __slots__ = ("owner", "clock", "cpu0", "t_call", "cut", "first", "done")

    def __init__(self, owner: int, clock: int, cpu0: int, t_call: int) -> None:
        self.owner, self.clock, self.cpu0, self.t_call = owner, clock, cpu0, t_call
        self.cut = model.cut_ns  # the runtime's running cut when the window began
        self.first = 0  # real time of the device thread's first op
        self.done = 0  # real time the graph task finished (its final callback)

    def owner_cpu(self) -> int:
        return time.clock_gettime_ns(self.clock) - self.cpu0


def install() -> None:
    """Wrap torch.autograd's engine entry (idempotent); a no-op when nothing records."""
    global _orig
    if _orig is not None or not hasattr(time, "pthread_getcpuclockid"):
        return
    _orig = torch.autograd._engine_run_backward

    def _engine_run_backward(*args, **kwargs):
        if not _prof._is_profiler_enabled:
            return _orig(*args, **kwargs)
        owner = threading.get_ident()
        clock = time.pthread_getcpuclockid(owner)
        _end_stretch(_now())
        call = _Call(owner, clock, time.clock_gettime_ns(clock), _now())
        _calls.append(call)
        try:
            return _orig(*args, **kwargs)
        finally:
            _calls.remove(call)
            _settle(call)
            if hostcost.NATIVE is not None:
                hostcost.NATIVE.neuron_stretch_begins()

    torch.autograd._engine_run_backward = _engine_run_backward  # backward() and grad() call it


def device_op(t0: int) -> None:
    """A backward op reached the runtime at real time `t0`: on the device thread's first op of
    a call, cut the wait for it to wake and ask to hear when the graph is done."""
    if not _calls:
        return
    call = _calls[-1]
    if call.first or threading.get_ident() == call.owner:
        return
    call.first = t0
    try:
        torch.autograd.Variable._execution_engine.queue_callback(lambda: _finished(call))
    except RuntimeError:  # not inside the engine after all: nothing to hear
        call.done = -1
    idle = t0 - call.t_call - call.owner_cpu()
    if idle > 0 and model.cut_ns == call.cut:
        _cut(t0 - idle, t0)


def _finished(call: _Call) -> None:
    call.done = _now()  # a final callback: runs on the thread that finished the graph
    call.cut = model.cut_ns


def _settle(call: _Call) -> None:
    if call.done <= 0 or not _prof._is_profiler_enabled:
        return
    t_ret = _now()
    idle = t_ret - max(call.done, model.last_end_ns) - call.owner_cpu()
    if idle > 0:
        _cut(t_ret - idle, t_ret)


def _end_stretch(t: int) -> None:
    """The caller enters the engine at real time `t`: cut what it spent off its own work since
    its last op's return (guard.cpp's neuron_stretch_off), within that stretch."""
    lib = hostcost.NATIVE
    if lib is None or not hostcost.ON:
        return
    since = ctypes.c_int64(0)
    off = lib.neuron_stretch_off(ctypes.byref(since))
    last = model.last_end_ns
    if since.value <= last:  # no stretch of this thread's since the last runtime call
        return
    off = min(off, t - since.value)
    if off > 0:
        hostcost.QUEUED_NS[0] += off
        _cut(t - off, t)


def _cut(t0: int, t1: int) -> None:
    from neuron_explorer.backend.runtime import events

    events.record_host("cut", "autograd hand-off", "", (), (), threading.get_native_id(), t0, t1,
                       0, None, -1, False)  # fmt: skip

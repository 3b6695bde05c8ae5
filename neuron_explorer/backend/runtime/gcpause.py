"""Python garbage-collector pauses while recording: simulator time, cut from the host clock.

The simulator keeps Python objects per op (payload wrappers, plans, raw event records), so the
collector runs far more often, and scans far more, than it would for the same program on a real
device. A collection that starts inside a backend call is already inside that call's measured
span and cut with it; one that starts in the user's code or in torch (an allocation there
tipped the counter) would land on the host timeline. Measured on 3 recorded TinyGPT steps:
24 ms of 38 ms of pauses started outside backend calls, a quarter of the modeled step time.

So while a torch.profiler session records, each collection that starts outside the backend's
frames becomes a host record of kind "gc": its real span, modeled cost 0. Capture uses it for
the clock only (it is not an event). A program that makes much garbage of its own has those
pauses cut too; docs/device.md says so.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import types

from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import hostcost

_BACKEND_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_now = time.time_ns
_start = 0  # real start of the collection being timed; 0 when none is
_installed = False


def _inside_backend() -> bool:
    """True when a frame of the backend is on this thread's stack (its call's span holds us)."""
    f: types.FrameType | None
    try:
        f = sys._getframe(2)
    except ValueError:  # no Python frames: a collection from C++ (autograd's device thread)
        return False
    while f is not None:
        if f.f_code.co_filename.startswith(_BACKEND_DIR):
            return True
        f = f.f_back
    return False


def _on_gc(phase: str, info: dict) -> None:
    global _start
    if phase == "start":
        _start = _now() if _prof._is_profiler_enabled and not _inside_backend() else 0
        if _start and hostcost.FREES:  # the wrapper frees inside it are inside its pause
            hostcost.NATIVE.neuron_gc(1)  # type: ignore[union-attr]
    elif _start:
        t0, _start = _start, 0
        if hostcost.FREES:
            hostcost.NATIVE.neuron_gc(0)  # type: ignore[union-attr]
        from neuron_explorer.backend.runtime import events

        events.record_host("gc", "python gc", "", (), (), threading.get_native_id(), t0, _now(),
                           0, None, -1, False, args={"generation": info.get("generation", -1)})  # fmt: skip


def install() -> None:
    """Time collections from now on (idempotent); the callback is a no-op when not recording."""
    global _installed
    if not _installed:
        gc.callbacks.append(_on_gc)
        _installed = True

"""Device memory accounting: bytes of the payload storages that neuron tensors allocated.

A tensor's bytes count from the op that allocated it until its wrapper is gone; views and
in-place results allocate nothing. While the profiler records, each change is a memory event.
"""

from __future__ import annotations

import threading
import time
import weakref

from torch.autograd import profiler as _prof

from backend.runtime import events

_allocated = 0
_peak = 0
_live: dict[int, weakref.ref] = {}
_lock = threading.Lock()


def allocated() -> int:
    return _allocated


def peak() -> int:
    return _peak


def reset_peak() -> None:
    global _peak
    _peak = _allocated


def track(wrapper, nbytes: int) -> None:
    """Count `nbytes` until `wrapper` is collected."""
    global _allocated, _peak
    if nbytes <= 0:
        return
    key = id(wrapper)
    ref = weakref.ref(wrapper, lambda _r, key=key, n=nbytes: _free(key, n))
    with _lock:
        _live[key] = ref
        _allocated += nbytes
        if _allocated > _peak:
            _peak = _allocated
    if _prof._is_profiler_enabled:
        _record(nbytes)


def _free(key: int, nbytes: int) -> None:
    global _allocated
    with _lock:
        _live.pop(key, None)
        _allocated -= nbytes
    if _prof._is_profiler_enabled:
        _record(-nbytes)


def _record(delta: int) -> None:
    events.append(
        (
            "memory",
            events.next_id(),
            threading.get_native_id(),
            time.time_ns(),
            _allocated,
            delta,
            _peak,
        )  # fmt: skip
    )

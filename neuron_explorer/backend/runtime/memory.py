"""Device memory accounting: bytes of the payload storages that neuron tensors allocated.

Counted per storage, as the CUDA caching allocator counts blocks: a storage's bytes count from
the op that allocated it until its last tensor or view is gone (a view that outlives its base
keeps the storage counted); views and in-place results allocate nothing. While the profiler
records, each change is a memory event.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref

from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import events, model

_allocated = 0
_peak = 0
# id(storage) -> weakref to it. torch keeps one Python object per live StorageImpl (PyObject
# preservation), so its id is stable while any tensor uses it and the weakref's callback runs
# exactly when the last one goes.
_live: dict[int, weakref.ref] = {}
_lock = threading.Lock()
_weakref, _partial = weakref.ref, functools.partial
# the runtime's raw records, appended without a call (an allocation's and a free's record are on
# every new tensor's path: four Python calls each were a third of a recorded mm's; issue 16)
_buf, _ids, _thread, _Memory = events._buf, events._ids, events._thread, events.MemoryRecord
_now = time.time_ns


def allocated() -> int:
    return _allocated


def peak() -> int:
    return _peak


def reset_peak() -> None:
    global _peak
    _peak = _allocated


def track(payload) -> None:
    """Count the bytes of `payload`'s storage until its last tensor is collected (once per
    storage, however many tensors share it)."""
    global _allocated, _peak
    storage = payload.untyped_storage()
    key = id(storage)
    if key in _live:
        return
    nbytes = storage.nbytes()
    if nbytes <= 0:
        return
    ref = _weakref(storage, _partial(_free, key, nbytes))  # _free(key, nbytes, ref) at its end
    with _lock:
        _live[key] = ref
        _allocated += nbytes
        if _allocated > _peak:
            _peak = _allocated
    if _prof._is_profiler_enabled:
        _buf.append((_Memory, next(_ids), _tid(), _now(), model.cut_ns, _allocated, nbytes, _peak))


def _free(key: int, nbytes: int, _ref: object = None) -> None:
    """The storage is gone (called as its weak reference's callback: one Python call, not two,
    per freed storage)."""
    global _allocated
    with _lock:
        _live.pop(key, None)
        _allocated -= nbytes
    if _prof._is_profiler_enabled:
        _buf.append((_Memory, next(_ids), _tid(), _now(), model.cut_ns, _allocated, -nbytes, _peak))


def _tid() -> int:
    """events.native_tid's cached id, read in place (one call where native_tid makes two)."""
    try:
        return _thread.tid
    except AttributeError:
        return events.native_tid()

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
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
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
# memory_history.py's hooks while it records: ON_ALLOC(key, storage, nbytes), ON_FREE(key, nbytes)
ON_ALLOC: Callable[[int, Any, int], None] | None = None
ON_FREE: Callable[[int, int], None] | None = None
# the Kineto plugin's report of an allocation (bytes > 0) or free to torch.profiler's memory
# profile while a profiler runs: ON_PROFILED(key, bytes, allocated, reserved) (kineto_plugin.py)
ON_PROFILED: Callable[[int, int, int, int], None] | None = None
# run once, at the process's first device allocation: the hooks only a program that uses the
# device needs (the autograd engine's entry, gc and optimizer callbacks; _registration.py)
ON_FIRST_USE: list[Callable[[], None]] = []


# What held device memory: bytes of live storages by role, tagged once they are known to be a
# module's parameter, a parameter's gradient or an optimizer's state (the rest is activations
# and temporaries); `_at_peak` is a copy taken each time the peak rises
ROLES = ("parameters", "gradients", "optimizer state")
_role_of: dict[int, str] = {}  # storage key -> its role
_role_bytes = dict.fromkeys(ROLES, 0)
_at_peak = dict.fromkeys(ROLES, 0)
# allocation order: a storage's serial, and the serial of the last allocation when the peak
# rose, so a storage tagged after the peak (AdamW's state, made inside its first step) moves
# into its role at the peak exactly when it was already live then (born no later, alive since)
_born: dict[int, int] = {}
_serial = 0
_peak_serial = 0


def allocated() -> int:
    return _allocated


def peak() -> int:
    return _peak


def reset_peak() -> None:
    global _peak, _at_peak, _peak_serial
    _peak = _allocated
    _at_peak = dict(_role_bytes)
    _peak_serial = _serial


def tag(tensor, role: str) -> None:
    """Mark the storage of a neuron tensor (its payload's) as holding `role` (one of ROLES),
    where the device counts it and no role was given it yet."""
    tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard (FSDP2, TP)
    payload = getattr(tensor, "_payload", None)
    if payload is None or type(payload) is not torch.Tensor:
        return
    key = id(payload.untyped_storage())
    if key not in _live or key in _role_of:
        return
    nbytes = payload.untyped_storage().nbytes()
    with _lock:
        _role_of[key] = role
        _role_bytes[role] += nbytes
        if _born.get(key, _peak_serial + 1) <= _peak_serial:  # live at the peak, untagged then
            _at_peak[role] += nbytes


def held_at_peak() -> dict[str, int]:
    """The peak (bytes) and what held it: each role's bytes, and the rest as "activations and
    other" (activations, temporaries, buffers and inputs)."""
    with _lock:
        held = dict(_at_peak)
        peak = _peak
    held["activations and other"] = max(0, peak - sum(held.values()))
    return {"peak": peak, **held}


_resized: dict[int, int] = {}  # storage key -> bytes it gained by resizes since it was counted


def resized(storage, old_nbytes: int) -> None:
    """`storage` changed size in place from `old_nbytes`: FSDP2 frees an unsharded parameter
    by resizing its storage to 0 and gets it back by resizing it to full size."""
    global _allocated, _peak, _serial, _peak_serial
    key = id(storage)
    new = storage.nbytes()
    delta = new - old_nbytes
    if not delta:
        return
    counted = key in _live
    with _lock:
        if key not in _live:  # made empty, never counted: counted from now, at its new size
            if new <= 0:
                return
            _live[key] = _weakref(storage, _partial(_free, key, 0))
            _serial += 1
            _born[key] = _serial
        _resized[key] = _resized.get(key, 0) + delta
        _allocated += delta
        role = _role_of.get(key)
        if role is not None:
            _role_bytes[role] += delta
        if _allocated > _peak:
            _peak = _allocated
            _peak_serial = _serial
            _at_peak.update(_role_bytes)
    if ON_ALLOC is not None:  # the history sees a resize as a free and a new allocation
        if counted and old_nbytes > 0 and ON_FREE is not None:
            ON_FREE(key, old_nbytes)
        if new > 0:
            ON_ALLOC(key, storage, new)
    if _prof._is_profiler_enabled:
        _buf.append((_Memory, next(_ids), _tid(), _now(), model.cut_ns, _allocated, delta, _peak))


_NO_MEMORY = (FakeTensor, FunctionalTensor)


def _first_use() -> None:
    hooks, ON_FIRST_USE[:] = ON_FIRST_USE[:], []
    for hook in hooks:
        hook()


def track(payload) -> None:
    """Count the bytes of `payload`'s storage until its last tensor is collected (once per
    storage, however many tensors share it)."""
    global _allocated, _peak, _serial, _peak_serial
    if isinstance(payload, _NO_MEMORY):  # a compile's tracing payload holds no device memory
        return
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
        _serial += 1
        _born[key] = _serial
        if _allocated > _peak:
            _peak = _allocated
            _peak_serial = _serial
            _at_peak.update(_role_bytes)
    if ON_FIRST_USE:
        _first_use()
    if ON_ALLOC is not None:
        ON_ALLOC(key, storage, nbytes)
    if _prof._is_profiler_enabled:
        _buf.append((_Memory, next(_ids), _tid(), _now(), model.cut_ns, _allocated, nbytes, _peak))
        if ON_PROFILED is not None:
            ON_PROFILED(key, nbytes, _allocated, _allocated)  # nothing is cached: reserved too


def _free(key: int, nbytes: int, _ref: object = None) -> None:
    """The storage is gone (called as its weak reference's callback: one Python call, not two,
    per freed storage)."""
    global _allocated
    with _lock:
        _live.pop(key, None)
        _born.pop(key, None)
        nbytes += _resized.pop(key, 0)
        _allocated -= nbytes
        role = _role_of.pop(key, None)
        if role is not None:
            _role_bytes[role] -= nbytes
    if ON_FREE is not None:
        ON_FREE(key, nbytes)
    if _prof._is_profiler_enabled:
        _buf.append((_Memory, next(_ids), _tid(), _now(), model.cut_ns, _allocated, -nbytes, _peak))
        if ON_PROFILED is not None:
            ON_PROFILED(key, -nbytes, _allocated, _allocated)


def live_storages() -> list[tuple[int, int, int]]:
    """(key, bytes, address) of every storage counted now."""
    with _lock:
        refs = list(_live.items())
    out = []
    for key, ref in refs:
        storage = ref()
        if storage is None or storage.nbytes() <= 0:
            continue
        try:  # a compile's fake or functional storage has no address: it holds no memory
            out.append((key, storage.nbytes(), storage.data_ptr()))
        except RuntimeError:
            continue
    return out


def _tid() -> int:
    """events.native_tid's cached id, read in place (one call where native_tid makes two)."""
    try:
        return _thread.tid
    except AttributeError:
        return events.native_tid()

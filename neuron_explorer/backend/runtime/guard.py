"""Device guard and hooks for `neuron` (PrivateUse1).

The Python guard from torch._C._acc can abort the process at exit after an exception inside a
backward kernel (docs/architecture.md), and its hooks lack pinned memory and generators, so at first use
we build a small C++ guard and hooks (guard.cpp) with g++ against the installed torch headers,
cache the library and load it. Without a compiler the Python guard and hooks are used, with a
warning. With either, an exit hook lets autograd's device thread go idle before the
interpreter finalizes (see `_settle_device_thread`).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

_SOURCE = Path(__file__).with_name("guard.cpp")
_keep: list = []  # the hooks, guard and ctypes callback must outlive every use
kind = "none"  # "native" once the C++ guard is loaded, else "python"
native: ctypes.CDLL | None = None  # the C++ library once loaded (hostcost.py reads its clock)
fast_attributes = False  # torch's two lookups on the wrapper answered in C (fast_attrs)


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _PythonGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _settle_device_thread() -> bool:
    """At exit, with either guard: let autograd's device thread finish what it still holds.

    Backward on the device runs on a C++ thread of autograd's, which runs our
    __torch_dispatch__ and drops a finished backward's last references (graph task, input
    buffers, the gradients it hands back) only after the caller has seen that backward
    complete. Dropping a C++ reference to a tensor that has a Python object takes the GIL, not
    only when it frees the object: torch (2.13) also lets go of the Python object when the C++
    count falls from 2 to 1, so a tensor that Python keeps alive costs the thread the GIL too.
    Should that happen once the interpreter finalizes, CPython ends the thread from C++ frames
    that cannot unwind and the process aborts ("terminate called without an active exception",
    seen at the exit of 4-rank DDP runs, the device thread in ~GraphTask). The thread works
    through its queue in order and finishes one task, cleanup included, before it takes the
    next: so once one scalar backward queued now has returned, everything before it is cleaned
    up, and waiting (GIL released) until the thread has let go of that backward's own tensors
    leaves it nothing to drop. True when it did within the bound (a second at most).
    """
    try:
        x = torch.zeros((), device="neuron", requires_grad=True)
        held = [torch.ones((), device="neuron")]  # the seed; given, so Python keeps it
        held += torch.autograd.grad(x * 1.0, x, grad_outputs=held[0])
    except Exception:  # noqa: BLE001 - best effort at exit, the device may be half torn down
        return False
    return _wait_released(held, deadline=time.monotonic() + SETTLE_S)


SETTLE_S = 1.0  # the most the exit waits for autograd's device thread


def _wait_released(held: list, deadline: float) -> bool:
    """Sleep (the GIL released) until no C++ reference holds any tensor of `held` nor, through
    it, its Python object: each is then held by its Python object alone (a count of 1) and by
    `held` and the call's argument alone on the Python side."""
    while True:
        if all(held[i]._use_count() == 1 and sys.getrefcount(held[i]) == 2
               for i in range(len(held))):  # fmt: skip
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "neuron-explorer"


def _library_path(source: Path = _SOURCE, stem: str = "neuron_guard") -> Path:
    """Where the library built from `source` is cached (autocast.py builds autocast.cpp too)."""
    tag = f"{torch.__version__}|{sys.version_info[:2]}|{torch._C._GLIBCXX_USE_CXX11_ABI}"
    digest = hashlib.sha256(source.read_bytes() + tag.encode()).hexdigest()[:16]
    return cache_dir() / f"{stem}_{digest}.so"


def build(path: Path, source: Path = _SOURCE, includes: tuple[str, ...] = ()) -> None:
    """Compile `source` (guard.cpp) into `path` (atomically: a temp file, then rename);
    `includes`: header folders under torch/include beside it (kineto_plugin.cpp's kineto)."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) found")
    torch_dir = Path(torch.__file__).parent
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    cmd = [
        compiler, "-O1", "-std=c++17", "-shared", "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-I{torch_dir / 'include'}", *(f"-I{torch_dir / 'include' / d}" for d in includes),
        str(source), f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu",
        f"-Wl,-rpath,{torch_dir / 'lib'}", "-o", tmp,
    ]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        os.replace(tmp, path)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"building {source.name} failed: {exc.stderr.decode()[-500:]}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _on_sync() -> None:
    try:
        from neuron_explorer.backend.runtime import dispatch

        dispatch.record_sync("torch.accelerator.synchronize", None)
    except Exception:  # noqa: BLE001 - never raise across the C boundary
        pass


def _stream_changed(stream_id: int) -> None:
    """torch made another stream current (torch.accelerator.set_stream, a StreamGuard)."""
    try:
        from neuron_explorer.backend import streams

        streams.became_current(stream_id)
    except Exception:  # noqa: BLE001 - never raise across the C boundary
        pass


def _memory_stats(out) -> None:
    """torch.accelerator's memory figures (guard.cpp's DeviceAllocator): allocated, peak, and
    the free and total bytes of the modeled chip's HBM."""
    try:
        from neuron_explorer.backend.runtime import memory, model

        total = int(model.spec().hbm_bytes)
        out[0], out[1] = memory.allocated(), memory.peak()
        out[2], out[3] = max(0, total - out[0]), total
    except Exception:  # noqa: BLE001 - never raise across the C boundary
        pass


def _reset_peak() -> None:
    try:
        from neuron_explorer.backend.runtime import memory

        memory.reset_peak()
    except Exception:  # noqa: BLE001 - never raise across the C boundary
        pass


def _load_native() -> None:
    path = _library_path()
    if not path.exists():
        build(path)
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    callback = ctypes.CFUNCTYPE(None)(_on_sync)
    lib.neuron_set_sync_callback(callback)
    lib.neuron_round_trip_slot.restype = ctypes.c_void_p
    lib.neuron_round_trip.argtypes = [ctypes.c_int]
    lib.neuron_watch_frees.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.neuron_free_cost.argtypes = [ctypes.c_int64]
    lib.neuron_gc.argtypes = [ctypes.c_int]
    lib.neuron_stretch_off.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    lib.neuron_stretch_off.restype = ctypes.c_int64
    lib.neuron_fast_attrs.argtypes = [ctypes.c_void_p] * 6
    changed = ctypes.CFUNCTYPE(None, ctypes.c_int64)(_stream_changed)
    lib.neuron_set_stream_callback(changed)
    lib.neuron_set_current_stream.argtypes = [ctypes.c_int64]
    from neuron_explorer.backend.runtime import queues

    queues.set_native_stream = lib.neuron_set_current_stream
    stats = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_int64))(_memory_stats)
    reset = ctypes.CFUNCTYPE(None)(_reset_peak)
    lib.neuron_set_memory_callbacks(stats, reset)
    _keep.extend([lib, callback, changed, stats, reset])
    global native
    native = lib


# Where CPython 3.11-3.13 (not free-threaded, no Py_TRACE_REFS) keep a type object's fields,
# in words: tp_name, tp_basicsize, tp_itemsize, tp_dealloc, tp_weaklistoffset, tp_dictoffset,
# tp_free, tp_finalize (all but the two slots written checked against what Python reports, or
# for tp_free against CPython's own function, before anything is written)
_WORD = ctypes.sizeof(ctypes.c_void_p)
_NAME, _BASICSIZE, _ITEMSIZE, _DEALLOC, _WEAKLIST, _DICT, _FREE, _FINALIZE = (
    3, 4, 5, 6, 26, 36, 40, 49)  # fmt: skip
_GETATTR, _GETATTRO = 8, 18  # tp_getattr (by C string), tp_getattro (guard.cpp reads it too)


def watch_frees(cls: type) -> bool:
    """Time the frees of `cls`'s instances (guard.cpp: from its tp_finalize, which must be
    empty, to the end of torch's base tensor type's tp_dealloc); True when done. Only where
    both type objects have the layout checked here, else False and frees stay on the host clock
    (docs/device.md)."""
    lib = native
    base = torch._C.TensorBase
    if lib is None or not all(map(_layout_is_known, (cls, base))):
        return False
    if ctypes.c_void_p.from_address(id(cls) + _FINALIZE * _WORD).value is not None:
        return False  # a finalizer of its own (a __del__): not ours to replace
    lib.neuron_watch_frees(id(cls) + _FINALIZE * _WORD, id(base) + _DEALLOC * _WORD)
    return True


def fast_attrs(cls: type) -> bool:
    """Let torch's lookups of `__torch_function__` and `__torch_dispatch__` on `cls`'s instances
    skip the generic attribute lookup (guard.cpp `neuron_getattr`, in `cls`'s empty tp_getattr
    slot); True when done, under the same layout check as watch_frees."""
    lib = native
    if lib is None or not _layout_is_known(cls):
        return False
    slot = id(cls) + _GETATTR * _WORD
    generic = ctypes.cast(ctypes.pythonapi.PyObject_GenericGetAttr, ctypes.c_void_p).value
    if (ctypes.c_void_p.from_address(slot).value is not None
            or ctypes.c_void_p.from_address(id(cls) + _GETATTRO * _WORD).value != generic):  # fmt: skip
        return False  # an attribute hook of its own (__getattr__): not ours to bypass
    torch_function = cls.__dict__.get("__torch_function__")
    if torch_function is not torch._C._disabled_torch_function_impl:
        return False
    dispatch = getattr(cls, "__torch_dispatch__")  # noqa: B009 - bound to cls, as the generic lookup binds it
    _keep.extend([torch_function, dispatch])
    api = ctypes.pythonapi
    lib.neuron_fast_attrs(id(cls), slot, id(torch_function), id(dispatch),
                          ctypes.cast(api.PyUnicode_InternFromString, ctypes.c_void_p).value,
                          ctypes.cast(api.Py_DecRef, ctypes.c_void_p).value)  # fmt: skip
    global fast_attributes
    fast_attributes = True
    return True


def _layout_is_known(t: type) -> bool:
    def word(k: int) -> int:
        return ctypes.c_ssize_t.from_address(id(t) + k * _WORD).value

    name = ctypes.c_char_p.from_address(id(t) + _NAME * _WORD).value or b""
    gc_del = ctypes.cast(ctypes.pythonapi.PyObject_GC_Del, ctypes.c_void_p).value
    return (name.rsplit(b".", 1)[-1] == t.__name__.encode()
            and (word(_BASICSIZE), word(_ITEMSIZE)) == (t.__basicsize__, t.__itemsize__)
            and (word(_WEAKLIST), word(_DICT)) == (t.__weakrefoffset__, t.__dictoffset__)
            and ctypes.c_void_p.from_address(id(t) + _FREE * _WORD).value == gc_del)  # fmt: skip


def install() -> str:
    """Register hooks and a guard: the C++ one when it builds, else the Python one."""
    global kind
    if os.environ.get("NEURON_PYTHON_GUARD") != "1":
        try:
            _load_native()  # its static initialisers register the guard and the hooks
            kind = "native"
            atexit.register(_settle_device_thread)
            return kind
        except Exception as exc:  # noqa: BLE001 - the Python guard still works
            problem: Exception | str = exc
    else:
        problem = "NEURON_PYTHON_GUARD=1"
    hooks, guard = _Hooks(), _PythonGuard()
    _keep.extend([hooks, guard])
    torch._C._acc.register_python_privateuseone_hook(hooks)
    torch._C._acc.register_python_privateuseone_device_guard(guard)
    atexit.register(_settle_device_thread)
    kind = "python"
    if problem != "NEURON_PYTHON_GUARD=1":
        warnings.warn(
            f"neuron: using the Python device guard ({problem}): no pinned memory, no neuron "
            "generators, and no torch.accelerator.synchronize() (install g++)",
            RuntimeWarning,
            stacklevel=2,
        )
    return kind

"""Which ops ran on the device, which fell back to the CPU, and the eager compile cache."""

from __future__ import annotations

import threading
import types
import warnings
from typing import Any

_lock = threading.Lock()
executed: set[str] = set()
fallback: set[str] = set()
_warned: set[str] = set()
_f64_warned = False
# (op, shapes, dtypes) -> (kernel plan, shapes, dtypes); None until the cost model lowered it.
# The op is its OpInfo (one per OpOverload), which hashes by identity, unlike an OpOverload.
compile_cache: dict[tuple, object] = {}
# key -> what a recorded call's kernel was lowered for beyond its inputs' shapes and dtypes (its
# outputs, a matmul's operand layout): a call of the same key that differs gets its own entry
compile_sig: dict[tuple, tuple] = {}
stats = {"eager_compiles": 0, "eager_cache_hits": 0}
_MISSING = object()
# bound once: note_key runs on every kernel call (these containers are cleared, never rebound)
_executed_add = executed.add
_cache_get = compile_cache.get


def note_key(info, inputs: list) -> tuple[tuple, bool, Any]:
    """Count one kernel call: its cache key (op, then each input's shape and dtype, as its
    wrapper keeps them: NeuronTensor._meta), True when that key compiles now, and its cache
    entry (None until lowered)."""
    _executed_add(info.name)
    n = len(inputs)  # the usual one and two inputs without building a list (once per op)
    if n == 1:
        key: tuple = (info, inputs[0][1]._meta)
    elif n == 2:
        key = (info, inputs[0][1]._meta, inputs[1][1]._meta)
    else:
        key = (info, *[w._meta for _p, w in inputs])
    entry = _cache_get(key, _MISSING)
    if entry is not _MISSING:
        stats["eager_cache_hits"] += 1
        return key, False, entry
    compile_cache[key] = None
    stats["eager_compiles"] += 1
    return key, True, None


def clear_compile_cache() -> None:
    compile_cache.clear()
    compile_sig.clear()


def warn_fallback(name: str) -> None:
    fallback.add(name)
    if name not in _warned:
        with _lock:
            if name in _warned:
                return
            _warned.add(name)
        _warn_at_user_line(
            f"neuron: {name} is not supported on the device; it runs on the CPU "
            "(copies to and from the host each call). See neuron_explorer.backend.supported_ops()."
        )


def warn_float64() -> None:
    global _f64_warned
    if not _f64_warned:
        _f64_warned = True
        _warn_at_user_line(
            "neuron: float64 is computed as float32 on the device (results keep float32 "
            "precision); use float32 or bfloat16."
        )


def _warn_at_user_line(message: str) -> None:
    """Warn pointing at the user's line (not torch's or ours), like a CUDA warning would.

    Backward kernels run on autograd's device thread, whose stack has no user frame: the
    warning then names the backward node and points at the user's `.backward()` (or
    `autograd.grad`) call, on the thread that waits for it.
    """
    import torch

    from neuron_explorer.backend.runtime.source import user_frame

    where = user_frame(3)
    node = torch._C._current_autograd_node()
    if node is not None:
        message = message.replace(
            " is not supported", f" (backward of {node.name()}) is not supported", 1
        )
        if where is None:
            where = backward_caller()
    if where is None:
        warnings.warn(message, UserWarning, stacklevel=3)
    else:
        warnings.warn_explicit(message, UserWarning, where[0], where[1])


def backward_caller() -> tuple[str, int, str] | None:
    """The user frame that called backward: on another thread, blocked in autograd's engine."""
    import sys
    import threading

    from neuron_explorer.backend.runtime.source import is_user_file

    me = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        in_engine = False
        f: types.FrameType | None = frame
        while f is not None:
            code = f.f_code
            if code.co_name in ("_engine_run_backward", "run_backward"):
                in_engine = True
            elif in_engine and is_user_file(code.co_filename):
                return code.co_filename, f.f_lineno, code.co_name
            f = f.f_back
    return None


def get_executed_ops() -> list[str]:
    """Ops that launched device kernels since the last clear_op_tracking() (fallbacks are in
    get_fallback_ops())."""
    return sorted(executed)


def get_fallback_ops() -> list[str]:
    """Ops that ran as CPU fallbacks since the last clear_op_tracking()."""
    return sorted(fallback)


def clear_op_tracking() -> None:
    """Forget executed and fallback ops (warnings already given are not repeated)."""
    executed.clear()
    fallback.clear()

"""Ops registered on the PrivateUse1 key: factories with no neuron input, and `_copy_from`;
and the composites (runtime/composites.py) on AutogradPrivateUse1."""

from __future__ import annotations

import time

import torch
from torch.autograd import profiler as _prof

_lib: torch.library.Library | None = None
_now = time.time_ns


def _start() -> int:
    """The real time a factory began, while a profiler records (0 otherwise)."""
    return _now() if _prof._is_profiler_enabled else 0


def _made(name: str, payload: torch.Tensor, t0: int):
    """The neuron tensor of a factory's payload. While recording, the factory's Python span is
    simulator time, cut like a metadata op's (a real device's allocator answers from its cache):
    `empty` took 57 us of a GPT-2 step's modeled host clock against 1 us on the CPU. Unlike an
    op's, no calibrated round trip is cut with it: torch calls a factory from C++, without the
    Python argument parsing that hostcost.py's calibration (a Python `view` call) includes, so
    cutting that much would take real time from the ops around it."""
    from neuron_explorer.backend.runtime import events
    from neuron_explorer.backend.tensor import new_tensor

    w = new_tensor(name, payload)
    if t0:
        events.record_host("cut", name, name, (), (), events.native_tid(), t0, _now(), 0, None,
                           -1, False)  # fmt: skip
    return w


def _empty_memory_format(
    size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    t0 = _start()
    payload = torch.empty(
        size, dtype=dtype, layout=layout, device="cpu", memory_format=memory_format
    )
    return _made("aten::empty.memory_format", payload, t0)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    t0 = _start()
    payload = torch.empty_strided(size, stride, dtype=dtype, layout=layout, device="cpu")
    return _made("aten::empty_strided", payload, t0)


def _efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # forward-mode AD (torch.func.jvp, hessian) asks for a zero tensor it never writes; real
    # zeros give the same numbers
    t0 = _start()
    payload = torch.zeros(size, dtype=dtype, layout=layout, device="cpu")
    return _made("aten::_efficientzerotensor", payload, t0)


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    from neuron_explorer.backend.runtime.dispatch import copy_between

    return copy_between(dst, src)


def register_library_impls() -> None:
    """Install the PrivateUse1 kernels once per process (the Library must stay alive)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    lib.impl("_efficientzerotensor", _efficientzerotensor, "PrivateUse1")
    from neuron_explorer.backend.runtime import composites, unsupported

    composites.register(lib)
    unsupported.register()
    from neuron_explorer.backend import compiler

    compiler.no_device_constants()
    _lib = lib

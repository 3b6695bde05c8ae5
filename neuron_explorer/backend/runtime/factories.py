"""Ops registered on the PrivateUse1 key: factories with no neuron input, and `_copy_from`;
and the composites (runtime/composites.py) on AutogradPrivateUse1."""

from __future__ import annotations

import time

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import shapes

_lib: torch.library.Library | None = None
_now = time.time_ns


def _start() -> tuple[int, int]:
    """(the real time a factory began, the round trip to cut before it) while a profiler
    records, else (0, 0). Read before the payload's own CPU op opens a record function: with
    the C++ guard the factory's span starts at its record's start (hostcost.round_trip)."""
    if not _prof._is_profiler_enabled:
        return 0, 0
    from neuron_explorer.backend.runtime import hostcost

    o, t0 = hostcost.round_trip(_now())
    return t0, o


def _made(name: str, payload: torch.Tensor, start: tuple[int, int]):
    """The neuron tensor of a factory's payload. While recording, the factory's Python span is
    simulator time, cut like a metadata op's (a real device's allocator answers from its cache):
    `empty` took 57 us of a GPT-2 step's modeled host clock against 1 us on the CPU. With the
    C++ guard its exact round trip (the dispatcher's call into our Python impl and back) is cut
    too, and it keeps a metadata op's documented host cost (spec.py); with the Python guard no
    calibrated round trip is cut with it: torch calls a factory from C++, without the Python
    argument parsing that hostcost.py's calibration (a Python `view` call) includes."""
    from neuron_explorer.backend.runtime import events, hostcost, model
    from neuron_explorer.backend.tensor import new_tensor

    w = new_tensor(name, payload)
    t0, o = start
    if t0:
        model.cut_ns += o  # add_cut(o, 0): the round trip before the span, as an op's
        cost = model.spec().runtime.metadata_ns if hostcost.EXACT else 0
        events.record_host("cut", name, name, (), (), events.native_tid(), t0, _now(), cost,
                           None, -1, False)  # fmt: skip
    return w


def _empty_memory_format(
    size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    start = _start()
    payload = torch.empty(
        size,
        dtype=dtype,
        layout=layout,
        device=shapes.payload_device(),
        memory_format=memory_format,
    )
    return _made("aten::empty.memory_format", payload, start)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    start = _start()
    payload = torch.empty_strided(
        size, stride, dtype=dtype, layout=layout, device=shapes.payload_device()
    )
    return _made("aten::empty_strided", payload, start)


def _efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # forward-mode AD (torch.func.jvp, hessian) asks for a zero tensor it never writes; real
    # zeros give the same numbers
    start = _start()
    payload = torch.zeros(size, dtype=dtype, layout=layout, device=shapes.payload_device())
    return _made("aten::_efficientzerotensor", payload, start)


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    from neuron_explorer.backend.runtime.dispatch import copy_between

    return copy_between(dst, src)


def _local_scalar_dense(t: torch.Tensor):
    # torch.tensor([a.max(), a.min()]) reads each 0-dim element with the Python key excluded
    # (tensor_new.cpp), so the read reaches the backend key: it is the same sync as .item()
    from neuron_explorer.backend.runtime.dispatch import dispatch

    return dispatch(torch.ops.aten._local_scalar_dense.default, (t,), {})


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
    lib.impl("_local_scalar_dense", _local_scalar_dense, "PrivateUse1")
    from neuron_explorer.backend.runtime import composites, unsupported

    composites.register(lib)
    unsupported.register()
    from neuron_explorer.backend import after_import, compiler

    compiler.no_device_constants()
    # dynamo must never trace into the runtime, from the first frame it traces on: the rule
    # goes in as soon as dynamo has loaded (the backend itself is called too late)
    after_import.run_after("torch._dynamo", compiler.skip_backend_frames)
    _lib = lib

"""Ops registered on the PrivateUse1 key: factories with no neuron input, and `_copy_from`;
and the composites (runtime/composites.py) on AutogradPrivateUse1."""

from __future__ import annotations

import torch

_lib: torch.library.Library | None = None


def _empty_memory_format(
    size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    from neuron_explorer.backend.runtime.dispatch import new_tensor

    payload = torch.empty(
        size, dtype=dtype, layout=layout, device="cpu", memory_format=memory_format
    )
    return new_tensor("aten::empty.memory_format", payload)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    from neuron_explorer.backend.runtime.dispatch import new_tensor

    payload = torch.empty_strided(size, stride, dtype=dtype, layout=layout, device="cpu")
    return new_tensor("aten::empty_strided", payload)


def _efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # forward-mode AD (torch.func.jvp, hessian) asks for a zero tensor it never writes; real
    # zeros give the same numbers
    from neuron_explorer.backend.runtime.dispatch import new_tensor

    payload = torch.zeros(size, dtype=dtype, layout=layout, device="cpu")
    return new_tensor("aten::_efficientzerotensor", payload)


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

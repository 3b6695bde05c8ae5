"""Ops that reach the device whole instead of as PyTorch's decomposition.

A few aten ops have a CPU kernel and, for every other backend, only a CompositeImplicitAutograd
decomposition (`silu_backward` is `math_silu_backward` there). On a neuron tensor torch would
run the decomposition (sigmoid, fill_, sub_, mul, ...) before `__torch_dispatch__` sees the op,
so the device computed a different sum of roundings than the CPU kernel: silu's gradient
differed from a CPU run by up to 4.8e-7. A PrivateUse1 kernel for the op turns the
decomposition off for this backend; the op then reaches `__torch_dispatch__` (the Python key
runs first) and its payload runs the CPU kernel, bit for bit.
"""

from __future__ import annotations

import torch

# every aten op with a CompositeImplicitAutograd kernel and a CPU kernel in torch 2.13 (found
# with torch._C._dispatch_has_kernel_for_dispatch_key; tests/test_device_runtime.py checks it)
WHOLE_OPS = ("silu_backward", "mish_backward", "native_channel_shuffle")
_lib: torch.library.Library | None = None


def _through_dispatch(name: str):
    op = getattr(torch.ops.aten, name).default

    def kernel(*args, **kwargs):  # only reached without the Python key (never for NeuronTensor)
        from neuron_explorer.backend.runtime import dispatch

        return dispatch.dispatch(op, args, kwargs)

    return kernel


def register() -> None:
    """Install the PrivateUse1 kernels once per process (the Library must stay alive)."""
    global _lib
    if _lib is None:
        lib = torch.library.Library("aten", "IMPL")
        for name in WHOLE_OPS:
            lib.impl(name, _through_dispatch(name), "PrivateUse1")
        from neuron_explorer.backend.runtime import grad_formulas

        grad_formulas.register(lib)  # autograd's CPU branches (prod, masked_fill, cumprod)
        _lib = lib


def decomposed_with_cpu_kernel() -> list[str]:
    """aten ops that torch decomposes for a backend without a kernel but that have a CPU one."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return sorted(
        n.removeprefix("aten::")
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::") and has(n, "CompositeImplicitAutograd") and has(n, "CPU")
    )

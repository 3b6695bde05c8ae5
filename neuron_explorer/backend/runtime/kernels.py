"""Host kernels: how the device computes an op on its CPU payload where the CPU's own kernel is
not what the chip does (docs/device.md, "How the numbers are computed").

- **bfloat16 matmul-class ops** (mm, bmm, addmm, baddbmm, linear, matmul, convolution and its
  backward, fused attention): the TensorE multiplies bf16 operands into fp32 PSUM accumulators
  and rounds once when the result leaves PSUM. The host does the same: bf16 operands widen to
  fp32 (exactly), the fp32 kernel accumulates in fp32, each bf16 result is rounded once. This is
  also 20-40x faster than the CPU's bf16 kernels (benchmarks/README.md).
- **dtypes the CPU kernel lacks** (`torch.histc` of integers, which transformers' MoE routing
  uses on any device but cpu and mps): computed in float64, which holds every integer of those
  dtypes exactly, and returned in the input's dtype, as an accelerator's kernel does.

- **CPU fallbacks** run with the conjugate and negative views' dispatch keys back on:
  inside `__torch_dispatch__` torch excludes them (they already ran for the wrapper), so a CPU
  kernel that builds a lazy conjugate view of its own (`linalg.pinv`'s `A.mH`, `linalg.lstsq`)
  and passes it on would have that bit ignored and return wrong complex numbers.

`host_kernel(func, call)` returns the callable the runtime uses for `func`'s payload op, or
`call` itself; both dispatch paths (plain and recorded) then run it like any payload op.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_BF16 = torch.bfloat16
_F32 = torch.float32
_Tensor = torch.Tensor
_SEQ = (list, tuple)

# packet name -> indices of the outputs that are bf16 when the inputs are (None: every
# floating output); the fused attention's logsumexp stays fp32, as on the CPU
FP32_ACCUMULATE: dict[str, tuple[int, ...] | None] = {
    "aten::mm": None,
    "aten::bmm": None,
    "aten::addmm": None,
    "aten::baddbmm": None,
    "aten::linear": None,
    "aten::matmul": None,
    "aten::convolution": None,
    "aten::convolution_backward": None,
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0,),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": None,
}

# packet name -> integer dtypes its CPU kernel lacks (computed in float64 instead)
INTEGER_VIA_FLOAT64: dict[str, frozenset] = {
    "aten::histc": frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}),
}


def host_kernel(func: torch._ops.OpOverload, call: Callable) -> Callable:
    """The payload callable for `func`: `call`, or a wrapper computing it as the device does."""
    schema = func._schema
    if any(a.is_out for a in schema.arguments) or schema.is_mutable:
        return call  # out= and in-place variants keep the CPU kernel
    if schema.name in FP32_ACCUMULATE:
        return _fp32_accumulate(call, FP32_ACCUMULATE[schema.name])
    if schema.name in INTEGER_VIA_FLOAT64:
        return _via_float64(call, INTEGER_VIA_FLOAT64[schema.name])
    return call


_CONJ, _NEG = torch._C.DispatchKey.Conjugate, torch._C.DispatchKey.Negative
_KeepExcluded = torch._C._SetExcludeDispatchKeyGuard


def with_math_bits(call: Callable) -> Callable:
    """`call` run with the Conjugate and Negative keys included, as a plain CPU call runs: a
    fallback's CPU kernel may make lazy conjugate views internally (3.5 us a call, so only
    fallbacks, which copy to the host anyway, pay it)."""

    def run(*args, **kwargs):
        with _KeepExcluded(_CONJ, False), _KeepExcluded(_NEG, False):
            return call(*args, **kwargs)

    return run


def _first_tensor(args) -> _Tensor | None:
    for a in args:
        if isinstance(a, _Tensor):
            return a
    return None


def _widen(a, dtype: torch.dtype, to: torch.dtype):
    if type(a) is _Tensor:
        return a.to(to) if a.dtype is dtype else a
    if type(a) in _SEQ and a and isinstance(a[0], _Tensor):  # a tensor list; never int lists
        return type(a)(_widen(x, dtype, to) for x in a)
    return a


def _fp32_accumulate(call: Callable, bf16_outputs: tuple[int, ...] | None) -> Callable:
    # on the launch-bound path of every bf16 matmul (autocast): one pass over the arguments,
    # `.float()`/`.bfloat16()` (the cheapest casts, ~2 us against ~3.5 us for `.to`), no
    # generators; this wrapper cost ~14 us a call before, more than the fp32 GEMM it wraps
    def run(*args, **kwargs):
        first = _first_tensor(args)
        # only real payloads: while tracing (fake payloads) the graph keeps the op as it is
        if type(first) is not _Tensor or first.dtype is not _BF16:
            return call(*args, **kwargs)
        wide = [
            a.float() if type(a) is _Tensor and a.dtype is _BF16 else _widen(a, _BF16, _F32)
            for a in args
        ]
        if kwargs:
            kwargs = {k: _widen(v, _BF16, _F32) for k, v in kwargs.items()}
        out = call(*wide, **kwargs)
        if type(out) is _Tensor:
            return out.bfloat16() if out.dtype is _F32 else out
        return type(out)(
            o.bfloat16()
            if isinstance(o, _Tensor)
            and o.dtype is _F32
            and (bf16_outputs is None or i in bf16_outputs)
            else o
            for i, o in enumerate(out)
        )

    return run


def _via_float64(call: Callable, dtypes: frozenset) -> Callable:
    def run(*args, **kwargs):
        first = _first_tensor(args)
        # fake payloads too: a compiled graph runs the op on the CPU as well
        if first is None or first.dtype not in dtypes:
            return call(*args, **kwargs)
        dtype = first.dtype
        out = call(first.to(torch.float64), *args[1:], **kwargs)
        return out.to(dtype)

    return run

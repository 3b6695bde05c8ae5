"""`torch.autocast(device_type="neuron")`: matmul-like ops in the autocast dtype (pass
dtype=torch.bfloat16: without one torch 2.13 takes float16 for PrivateUse1), numerically
sensitive ones in float32, everything else untouched (as on CUDA).

The kernels are C++ (autocast.cpp, built and cached like guard.cpp): a Python kernel costs a
round trip per autocast op and gets no weight-cast cache. Without a compiler, or with
NEURON_PYTHON_AUTOCAST=1, the Python kernel below runs instead, with the same lists and rule.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from pathlib import Path

import torch

from neuron_explorer.backend.tensor import NeuronTensor

LOWER_PRECISION = (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d",
    "convolution", "_convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "prelu", "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
)  # fmt: skip
FLOAT32 = (
    "softmax", "log_softmax", "layer_norm", "group_norm", "mse_loss", "nll_loss", "nll_loss_nd",
    "cross_entropy_loss", "binary_cross_entropy_with_logits", "exp", "log", "pow", "rsqrt",
    "cumsum", "norm", "frobenius_norm", "nuclear_norm", "cosine_similarity", "kl_div", "sum", "prod",
)  # fmt: skip

_KEY = torch._C.DispatchKey.AutocastPrivateUse1  # type: ignore[attr-defined]  # not in the stubs
_NOT_AUTOCAST = torch._C.DispatchKeySet(_KEY)
_Exclude = torch._C._ExcludeDispatchKeyGuard
_Tensor = torch.Tensor
_autocast_dtype = torch.get_autocast_dtype
_SEQ = (list, tuple)
_libs: list = []  # the fallthrough, then the C++ library or the Python kernels' Library
kind = "none"  # "native" once autocast.cpp's kernels are registered, else "python"


def _cast(a, dtype: torch.dtype):
    if isinstance(a, _Tensor):
        if (
            a.dtype is not dtype
            and a.is_floating_point()
            and (a.device.type != "cpu" or a.dim() == 0)
        ):
            return a.to(dtype)
        return a
    if type(a) in _SEQ and a and isinstance(a[0], _Tensor):  # a tensor list; never int lists
        return type(a)(_cast(x, dtype) for x in a)
    return a


def _kernel(op: torch._ops.OpOverload, fixed_dtype: torch.dtype | None):
    # every autocast-listed op of a launch-bound bf16 step runs this: one pass over the
    # arguments, a neuron tensor checked inline (no call), a prebuilt key set and the C++ op
    # (OpOverload.__call__ costs more): an autocast addmm of three fp32 operands 181 -> 171 us
    # (best of 25 rounds at load 7.4)
    call = getattr(op, "_op", op)

    def run(*args, **kwargs):
        dtype = fixed_dtype or _autocast_dtype("neuron")
        args = [
            a.to(dtype)
            if type(a) is NeuronTensor and a.dtype is not dtype and a.is_floating_point()
            else _cast(a, dtype)
            for a in args
        ]
        if kwargs:
            kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        with _Exclude(_NOT_AUTOCAST):
            return call(*args, **kwargs)

    return run


def _overloads() -> list[tuple[str, torch._ops.OpOverload, torch.dtype | None]]:
    """(name, op, fixed dtype) for every functional overload of the two lists. Out= overloads
    fall through, as on CUDA: casting their `out` would write the result into a copy."""
    found = []
    for names, dtype in ((LOWER_PRECISION, None), (FLOAT32, torch.float32)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            for overload in packet.overloads() if packet is not None else ():
                op = getattr(packet, overload)
                if not op._schema.is_mutable:
                    found.append(
                        (name if overload == "default" else f"{name}.{overload}", op, dtype)
                    )
    return found


def _register_native(ops) -> None:
    from neuron_explorer.backend.runtime import guard

    source = Path(__file__).with_name("autocast.cpp")
    path = guard._library_path(source, "neuron_autocast")
    if not path.exists():
        guard.build(path, source)
    lib = ctypes.CDLL(str(path))
    names = (ctypes.c_char_p * len(ops))(*(name.encode() for name, _, _ in ops))
    fp32 = (ctypes.c_int * len(ops))(*(int(dtype is not None) for _, _, dtype in ops))
    lib.neuron_autocast_error.restype = ctypes.c_char_p
    if lib.neuron_autocast_register(names, fp32, len(ops)) != 0:
        raise RuntimeError(lib.neuron_autocast_error().decode())
    _libs.append(lib)


def register() -> None:
    """Fall through AutocastPrivateUse1 for every op, except the two casting lists."""
    global kind
    if _libs:
        return
    every = torch.library.Library("_", "IMPL")
    every.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    _libs.append(every)
    ops = _overloads()
    if os.environ.get("NEURON_PYTHON_AUTOCAST") != "1":
        try:
            _register_native(ops)
            kind = "native"
            return
        except Exception as exc:  # noqa: BLE001 - the Python kernels still work
            warnings.warn(
                f"neuron: autocast runs Python kernels ({exc}): slower, no weight-cast "
                "cache (install g++)",
                RuntimeWarning,
                stacklevel=2,
            )
    lib = torch.library.Library("aten", "IMPL")
    for name, op, dtype in ops:
        lib.impl(name, _kernel(op, dtype), "AutocastPrivateUse1")
    _libs.append(lib)
    kind = "python"

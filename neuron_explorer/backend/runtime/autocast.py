"""`torch.autocast(device_type="neuron")`: matmul-like ops in the autocast dtype (bf16 default),
numerically sensitive ones in float32, everything else untouched (as on CUDA)."""

from __future__ import annotations

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
_libs: list[torch.library.Library] = []


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


def register() -> None:
    """Fall through AutocastPrivateUse1 for every op, except the two casting lists."""
    if _libs:
        return
    every = torch.library.Library("_", "IMPL")
    every.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    for names, dtype in ((LOWER_PRECISION, None), (FLOAT32, torch.float32)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                lib.impl(f"{name}.{overload}" if overload != "default" else name,
                         _kernel(getattr(packet, overload), dtype), "AutocastPrivateUse1")  # fmt: skip
    _libs.extend([every, lib])

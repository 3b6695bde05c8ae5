"""Autograd's CPU formulas for neuron tensors, where torch's own would take another branch.

PyTorch's derivative formulas take a composite-compliant branch for any tensor subclass or under
any dispatch mode (`isTensorSubclassLike` in FunctionsManual.cpp and ReduceOps.cpp), and a
device built on a wrapper subclass always got it, so its gradients rounded differently from a
CPU run (one float32 ulp relative, larger where a product is large). The kernels here, on
AutogradPrivateUse1, compute the CPU's plain branch from device ops, op for op as the C++ does,
so the gradients are the CPU's bit for bit (docs/device.md, "Op conformance"):

- **prod** (`prod`, `prod.dim_int`): `grad * (result / input).conj()` where no input is zero,
  not the exclusive-cumprod product (`prod_backward`);
- **masked_fill** with a tensor value: the value's gradient is `grad.masked_select(mask).sum()`
  (computed as `grad[mask]`, aten::index: the same elements in the same order, no fallback),
  not `where(mask, grad, 0).sum()` (`masked_fill_backward`);
- **cumprod_backward** (an aten op whose composite kernel holds the branch): the reversed
  cumsum over the input where no input is zero, and the O(n) masked form where one is and no
  higher-order gradient is asked.

The branch points (a count of zeros) read the data, as on the CPU. While tracing (fake tensors
under torch.compile, or any dispatch mode) the CPU takes the subclass branch itself, which
reads no data: so do these kernels then.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from neuron_explorer.backend.tensor import NeuronTensor

_aten = torch.ops.aten
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
_Tensor = torch.Tensor


def _plain(*tensors) -> bool:
    """True where the CPU would take its plain branch: no dispatch mode, and every tensor a
    neuron tensor with a real payload or a plain tensor (not fake, not traced)."""
    if _get_current_dispatch_mode() is not None:
        return False
    for t in tensors:
        if type(t) is NeuronTensor:
            if type(t._payload) is not _Tensor:
                return False
        elif type(t) is not _Tensor:
            return False
    return True


# ---- prod ---------------------------------------------------------------------------------


def _safe_zeros(grad, inp, dim: int):
    """FunctionsManual.cpp's prod_safe_zeros_backward: exclusive cumprods from both ends."""
    if inp.numel() == 0:
        return grad.expand_as(inp)
    n = inp.shape[dim]
    if n == 1:
        return grad
    ones_size = list(inp.shape)
    ones_size[dim] = 1
    ones = torch.ones(ones_size, dtype=grad.dtype, device=grad.device)
    normal = torch.cat([ones, inp.narrow(dim, 0, n - 1)], dim).cumprod(dim)
    reverse = torch.cat([ones, inp.narrow(dim, 1, n - 1).flip(dim)], dim).cumprod(dim).flip(dim)
    return grad * (normal * reverse).conj()


def _prod_backward(grad, inp, result):
    """FunctionsManual.cpp's prod_backward (the full reduction)."""
    if inp.dim() == 0:
        return grad
    if not _plain(inp):
        return _safe_zeros(grad, inp.contiguous().view(-1), 0).view_as(inp)
    zeros = int((inp == 0).sum())  # the CPU's (input == 0).nonzero() rows
    if zeros == 0:
        return grad * (result / inp).conj()
    if not torch.is_grad_enabled() and zeros > 1:
        return torch.zeros_like(inp, memory_format=torch.contiguous_format)
    return _safe_zeros(grad, inp.contiguous().view(-1), 0).view_as(inp)


def _prod_dim_backward(grad, inp, result, dim: int, keepdim: bool):
    """FunctionsManual.cpp's prod_backward (one dimension)."""
    if inp.dim() == 0:
        return grad
    dim = dim % inp.dim()
    if not keepdim:
        grad, result = grad.unsqueeze(dim), result.unsqueeze(dim)
    if _plain(inp) and int((inp == 0).sum()) == 0:
        return grad * (result / inp).conj()
    return _safe_zeros(grad, inp, dim)


class _Prod(torch.autograd.Function):
    @staticmethod
    def forward(keyset, func, kwargs, x, *args):  # type: ignore[override]
        return func.redispatch(keyset & _BELOW_AUTOGRAD, x, *args, **kwargs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.func, ctx.args = inputs[1], inputs[4:]
        ctx.save_for_backward(inputs[3], output)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, result = ctx.saved_tensors
        inp = x.to(grad.dtype)  # derivatives.yaml: self.to(grad.scalar_type())
        if ctx.func is _aten.prod.default:
            g = _prod_backward(grad, inp, result)
        else:
            keepdim = bool(ctx.args[1]) if len(ctx.args) > 1 else False
            g = _prod_dim_backward(grad, inp, result, ctx.args[0], keepdim)
        return None, None, None, g, *(None for _ in ctx.args)


def _prod_kernel(func):
    def kernel(keyset, x, *args, **kwargs):
        if not (torch.is_grad_enabled() and x.requires_grad):
            return func.redispatch(keyset & _BELOW_AUTOGRAD, x, *args, **kwargs)
        return _Prod.apply(keyset, func, kwargs, x, *args)

    return kernel


# ---- masked_fill with a tensor value ------------------------------------------------------


class _MaskedFill(torch.autograd.Function):
    @staticmethod
    def forward(keyset, x, mask, value):  # type: ignore[override]
        return _aten.masked_fill.Tensor.redispatch(keyset & _BELOW_AUTOGRAD, x, mask, value)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[2])

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        g_self = grad.masked_fill(mask, 0) if ctx.needs_input_grad[1] else None
        g_value = None
        if ctx.needs_input_grad[3]:
            if _plain(grad, mask):  # grad.masked_select(mask).sum(): the same elements, in order
                g_value = grad[mask.expand(grad.shape)].sum()
            else:
                g_value = torch.where(mask, grad, 0).sum()
        return None, g_self, None, g_value


def _masked_fill_kernel(keyset, x, mask, value):
    if not (torch.is_grad_enabled() and (x.requires_grad or value.requires_grad)):
        return _aten.masked_fill.Tensor.redispatch(keyset & _BELOW_AUTOGRAD, x, mask, value)
    return _MaskedFill.apply(keyset, x, mask, value)


# ---- cumprod_backward ---------------------------------------------------------------------


def _reversed_cumsum(w, dim: int):
    return w.flip(dim).cumsum(dim).flip(dim)


def cumprod_backward(grad, inp, dim: int, output):
    """ReduceOps.cpp's cumprod_backward on device ops (a masked_scatter_ of a masked_select as
    `where`: the same values moved, and no CPU fallback)."""
    if inp.numel() <= 1:
        return grad
    dim = dim % inp.dim()
    if inp.shape[dim] == 1:
        return grad
    if not _plain(inp, grad, output):
        return _aten.cumprod_backward.default.decompose(grad, inp, dim, output)
    input_conj, output_conj = inp.conj(), output.conj()
    w = output_conj * grad
    is_zero = inp == 0
    if not bool(is_zero.any()):
        return _reversed_cumsum(w, dim).div(input_conj)
    if torch.is_grad_enabled():  # the O(n^2) form, differentiable: the same values as the CPU's
        return _aten.cumprod_backward.default.decompose(grad, inp, dim, output)
    return _cumprod_backward_zeros(grad, input_conj, output_conj, w, is_zero, dim)


def _cumprod_backward_zeros(grad, input_conj, output_conj, w, is_zero, dim: int):
    """The O(n) form with zeros in the input (no higher-order gradient asked). The in-place
    steps stay in place: with a conjugate view as operand, `a.div_(b)` and `a.div(b)` round
    differently."""
    cumsum = is_zero.cumsum(dim)
    mask = cumsum == 0  # before the first zero
    before = _reversed_cumsum(w.masked_fill(~mask, 0.0), dim).div_(input_conj)
    grad_input = torch.where(mask, before, torch.zeros_like(before))
    mask = cumsum == 1
    first_zero_index = mask.max(dim, keepdim=True)[1]
    first_zero_mask = torch.zeros_like(mask).scatter(dim, first_zero_index, 1).logical_and(mask)
    mask = mask & ~first_zero_mask  # between the first zero and the second
    prev = torch.gather(output_conj, dim, (first_zero_index - 1).relu_())
    at_zero = (
        input_conj.masked_fill(~mask, 1.0)
        .cumprod(dim)
        .mul_(grad.masked_fill(cumsum != 1, 0.0))
        .sum(dim, keepdim=True)
        .mul_(prev.masked_fill_(first_zero_index == 0, 1.0))
    )
    return torch.where(first_zero_mask, at_zero.expand_as(grad_input), grad_input)


def register(lib: torch.library.Library) -> None:
    """Install the kernels on AutogradPrivateUse1 in `lib` (an aten IMPL library)."""
    for name, func in (("prod", _aten.prod.default), ("prod.dim_int", _aten.prod.dim_int)):
        lib.impl(name, _prod_kernel(func), "AutogradPrivateUse1", with_keyset=True)
    lib.impl("masked_fill.Tensor", _masked_fill_kernel, "AutogradPrivateUse1", with_keyset=True)
    lib.impl("cumprod_backward", cumprod_backward, "AutogradPrivateUse1")

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
  higher-order gradient is asked;
- **renorm**: its gradient reduces and computes in float64 on the CPU (the accumulate type of
  float32), which device ops would round to float32 at each step; it is one host op instead
  (`neuron_explorer::renorm_backward`, a CPU fallback as renorm itself is), the CPU's formula.

The autograd nodes are named as the forward ops (`ProdBackward`, `MaskedFillBackward`,
`RenormBackward`; torch's own are `ProdBackward0`, ...).

The branch points (a count of zeros) read the data, as on the CPU. Where the CPU itself takes
the subclass branch (fake tensors under torch.compile, any dispatch mode, torch.func's wrapped
tensors) and under forward-mode AD, torch's own autograd kernel runs, reached past these by a
redispatch to AutogradOther (renorm keeps its one host op in a traced graph: no data read).
"""

from __future__ import annotations

import math

import torch
from torch.autograd import forward_ad
from torch.utils._python_dispatch import _get_current_dispatch_mode

from neuron_explorer.backend.tensor import NeuronTensor

_aten = torch.ops.aten
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset
# torch's own autograd kernel for an op (VariableType, registered for every Autograd key): a
# redispatch to AutogradOther reaches it past the AutogradPrivateUse1 kernels here
_AUTOGRAD_OTHER = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradOther)
_Tensor = torch.Tensor


def _torchs_autograd() -> bool:
    """Where torch's own autograd runs instead: under torch.func transforms and forward-mode AD
    (the Functions here have no vmap rule or jvp, and the CPU takes the subclass branch there
    too: functorch's tensors are subclass-like)."""
    return torch._C._are_functorch_transforms_active() or forward_ad._current_level >= 0


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


class Prod(torch.autograd.Function):
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
        if _torchs_autograd() or not _plain(x):  # traced: the subclass branch, torch's own
            return func.redispatch((keyset & _BELOW_AUTOGRAD) | _AUTOGRAD_OTHER, x, *args, **kwargs)
        if not (torch.is_grad_enabled() and x.requires_grad):
            return func.redispatch(keyset & _BELOW_AUTOGRAD, x, *args, **kwargs)
        return Prod.apply(keyset, func, kwargs, x, *args)

    return kernel


# ---- masked_fill with a tensor value ------------------------------------------------------


class MaskedFill(torch.autograd.Function):
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
    # only the value's gradient differs: otherwise torch's own kernel (a C++ node, ~0.3 ms less
    # a step than a Python Function's)
    if (torch.is_grad_enabled() and value.requires_grad and not _torchs_autograd()
            and _plain(x, mask, value)):  # fmt: skip
        return MaskedFill.apply(keyset, x, mask, value)
    native = (keyset & _BELOW_AUTOGRAD) | _AUTOGRAD_OTHER
    return _aten.masked_fill.Tensor.redispatch(native, x, mask, value)


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
    if _torchs_autograd() or not _plain(inp, grad, output):
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


# ---- renorm ------------------------------------------------------------------------------


# the CPU's accumulate type (at::toAccumulateType on the CPU), which renorm_backward reduces in
_CPU_ACC = {
    torch.float32: torch.float64, torch.bfloat16: torch.float32, torch.float16: torch.float32,
    torch.float64: torch.float64, torch.complex64: torch.complex128,
    torch.complex128: torch.complex128,
}  # fmt: skip


@torch.library.custom_op("neuron_explorer::renorm_backward", mutates_args=())
def renorm_backward(grad: _Tensor, x: _Tensor, p: float, dim: int, maxnorm: float) -> _Tensor:
    """FunctionsManual.cpp's renorm_backward, on the host: its norm, sums and arithmetic in the
    CPU's accumulate type (float64 for float32), rounded once to the gradient's dtype. Device ops
    would round each float64 step to float32 (the device computes float64 as float32), so the
    whole gradient is one host computation, a CPU fallback as renorm's forward is."""
    n = x.dim()
    dim = dim % n
    dims = [d for d in range(n) if d != dim]
    acc = _CPU_ACC[x.dtype]
    norm = torch.linalg.vector_norm(x, p, dims, keepdim=True, dtype=acc)
    real_acc = acc.to_real()
    grad_output = x.conj() * grad
    if real_acc != acc:  # the norm is real, so its gradient's input is too
        grad_output = grad_output.real
    grad_output = grad_output.sum(dims, keepdim=True, dtype=real_acc)
    nb = _norm_backward(grad_output, x, p, norm, dims)
    invnorm = (norm + 1e-7).reciprocal()
    grad_norm = maxnorm * invnorm * (grad - invnorm * nb)
    return torch.where(norm > maxnorm, grad_norm.to(grad.dtype), grad)


def _norm_backward(grad, x, p: float, norm, dims):
    """FunctionsManual.cpp's norm_backward with keepdim (renorm's p > 0), in-place steps kept."""
    if p == 1.0:
        return x.sgn() * grad
    if p == 2.0:
        return grad * (x / norm).masked_fill_(norm == 0, 0)
    if math.isinf(p):
        x_abs = x.abs()
        mask = x_abs.eq(norm).logical_or(x_abs.isnan())
        return x.sgn() * ((grad / mask.sum(dims, True)) * mask)
    if p < 1.0:
        scaled = x.sgn() * x.abs().pow_(p - 1).masked_fill_(x == 0, 0)
        return scaled * grad * norm.pow(1 - p)
    scaled = x.sgn() * x.abs().pow_(p - 1) if p < 2.0 else x * x.abs().pow_(p - 2)
    scale_v = grad / norm.pow(p - 1)
    scale_v.masked_fill_(norm == 0, 0)
    return scaled * scale_v


@renorm_backward.register_fake
def _(grad, x, p, dim, maxnorm):
    return torch.empty_like(grad)


def _renorm_by_ops(grad, x, p, dim: int, maxnorm):
    """renorm's gradient as device ops that autograd differentiates again (a second-order
    gradient): of `x * maxnorm / (norm + 1e-7)` where the norm exceeds maxnorm, the function
    renorm_backward differentiates (in float32: the device computes float64 as float32)."""
    dims = [d for d in range(x.dim()) if d != dim % x.dim()]
    norm = torch.linalg.vector_norm(x, p, dims, keepdim=True)
    out = x * torch.where(norm > maxnorm, maxnorm / (norm + 1e-7), 1.0)
    return torch.autograd.grad(out, x, grad, create_graph=True)[0]


class Renorm(torch.autograd.Function):
    @staticmethod
    def forward(keyset, x, p, dim, maxnorm):  # type: ignore[override]
        return _aten.renorm.default.redispatch(keyset & _BELOW_AUTOGRAD, x, p, dim, maxnorm)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.args = inputs[2:]
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        p, dim, maxnorm = ctx.args
        if torch.is_grad_enabled():  # create_graph: a gradient autograd can differentiate
            g = _renorm_by_ops(grad, x, p, dim, maxnorm)
        else:  # one host op, also in a traced backward graph (its fake kernel gives the shape)
            g = renorm_backward(grad, x, float(p), dim, float(maxnorm))
        return None, g, None, None, None


def _renorm_kernel(keyset, x, p, dim, maxnorm):
    if _torchs_autograd():
        native = (keyset & _BELOW_AUTOGRAD) | _AUTOGRAD_OTHER
        return _aten.renorm.default.redispatch(native, x, p, dim, maxnorm)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return _aten.renorm.default.redispatch(keyset & _BELOW_AUTOGRAD, x, p, dim, maxnorm)
    return Renorm.apply(keyset, x, p, dim, maxnorm)


def register(lib: torch.library.Library) -> None:
    """Install the kernels on AutogradPrivateUse1 in `lib` (an aten IMPL library)."""
    for name, func in (("prod", _aten.prod.default), ("prod.dim_int", _aten.prod.dim_int)):
        lib.impl(name, _prod_kernel(func), "AutogradPrivateUse1", with_keyset=True)
    lib.impl("masked_fill.Tensor", _masked_fill_kernel, "AutogradPrivateUse1", with_keyset=True)
    lib.impl("cumprod_backward", cumprod_backward, "AutogradPrivateUse1")
    lib.impl("renorm", _renorm_kernel, "AutogradPrivateUse1", with_keyset=True)

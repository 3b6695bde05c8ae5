"""Gradients whose formulas torch branches on `isTensorSubclassLike` (prod, cumprod, masked_fill
with a tensor value) are the CPU's bit for bit on the device, on every branch: no zero in the
input, one, several, and a second-order gradient (runtime/grad_formulas.py; issue 11)."""

from __future__ import annotations

import warnings

import pytest
import torch

import neuron_explorer.backend  # noqa: F401  (registers the device)
from neuron_explorer.backend.runtime import grad_formulas


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _grads(fn, inputs, device, create_graph=False):
    """Gradients of fn(*inputs) on `device` with one fixed output gradient, on the CPU."""
    xs = [x.detach().to(device).requires_grad_(x.requires_grad) for x in inputs]
    out = fn(*xs)
    g = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(3))
    wrt = [x for x in xs if x.requires_grad]
    grads = torch.autograd.grad(out, wrt, g.to(device), create_graph=create_graph)
    if create_graph:  # a second-order gradient through the first
        second = torch.autograd.grad(sum(gr.abs().sum() for gr in grads), wrt, allow_unused=True)
        grads = (*grads, *(s for s in second if s is not None))
    return [gr.detach().cpu() for gr in grads]


def _inputs(zeros: int, dtype=torch.float32):
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1)).to(dtype) * 1.7
    flat = x.view(-1)
    flat[[6, 13, 7][:zeros]] = 0  # 6 and 7 share a row: two zeros in one slice
    return x.requires_grad_()


_CASES = {
    "prod": lambda x: x.prod(),
    "prod_dim": lambda x: x.prod(1),
    "prod_keepdim_dtype": lambda x: x.prod(0, keepdim=True, dtype=x.dtype),
    "cumprod": lambda x: x.cumprod(1),
    "cumprod_dim0": lambda x: x.cumprod(0),
}


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("zeros", [0, 1, 3])
@pytest.mark.parametrize("case", list(_CASES))
def test_prod_and_cumprod_gradients_are_the_cpus(case, zeros, dtype, create_graph):
    x = _inputs(zeros, dtype)
    cpu = _grads(_CASES[case], [x], "cpu", create_graph)
    dev = _grads(_CASES[case], [x], "neuron", create_graph)
    assert len(cpu) == len(dev)
    for c, d in zip(cpu, dev, strict=True):
        assert torch.equal(c, d), (case, (c - d).abs().max())


@pytest.mark.parametrize("mask_shape", [(4, 5), (5,), (1, 5)])
def test_masked_fill_value_gradient_is_the_cpus_masked_select_sum(mask_shape):
    x = _inputs(0)
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(2)) > 0.4
    value = torch.tensor(0.75, requires_grad=True)

    def fill(x, mask, value):
        return x.masked_fill(mask, value) * 1.3

    cpu = _grads(fill, [x, mask, value], "cpu")
    dev = _grads(fill, [x, mask, value], "neuron")
    assert [torch.equal(c, d) for c, d in zip(cpu, dev, strict=True)] == [True, True]
    # the plain CPU sum of the selected elements is not the sum over the whole masked tensor
    g = torch.randn(4, 5, generator=torch.Generator().manual_seed(3)) * 1.3
    assert torch.equal(dev[1], g.masked_select(mask.expand(4, 5)).sum())


def test_no_grad_and_inference_mode_run_the_op_alone():
    x = torch.randn(3, 4).to("neuron")
    with torch.no_grad():
        assert not x.requires_grad_().prod(1).requires_grad
    with torch.inference_mode():
        y = torch.randn(3, 4, device="neuron")
        assert torch.equal(y.prod(1).cpu(), y.cpu().prod(1))


def test_a_dispatch_mode_takes_the_subclass_branch_as_the_cpu_does():
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoOp(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.randn(3).to("neuron")
    assert grad_formulas._plain(x, torch.randn(2))
    with NoOp():
        assert not grad_formulas._plain(x)


@pytest.mark.slow  # torch.compile: dynamo and AOT autograd trace with fake tensors
def test_compiled_gradients_trace_the_subclass_branch_and_match_the_cpu():
    def f(x, v, mask):
        return x.prod(1).sum() + x.cumprod(1).sum() + x.masked_fill(mask, v).sum() + x.prod()

    x = _inputs(1)
    mask = torch.tensor([True, False, True, False, True])
    v = torch.tensor(2.0, requires_grad=True)
    compiled = torch.compile(f, backend="neuron", dynamic=False)
    cpu = _grads(lambda x, v: f(x, v, mask), [x, v], "cpu")
    dev = _grads(lambda x, v: compiled(x, v, mask.to("neuron")), [x, v], "neuron")
    for c, d in zip(cpu, dev, strict=True):
        torch.testing.assert_close(d, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("p", [0.5, 1, 2, 3.5, float("inf")])
def test_renorm_gradient_is_the_cpus_float64_formula_computed_once(p, dtype):
    # the CPU reduces and computes renorm's gradient in float64 (float32's accumulate type);
    # device ops would round each float64 step to float32: one host op gives the CPU's bits
    x = (torch.randn(4, 6, generator=torch.Generator().manual_seed(5)) * 2).to(dtype)
    x.view(-1)[3] = 0
    x.requires_grad_()
    for dim in (0, 1, -1):
        cpu = _grads(lambda t, d=dim: torch.renorm(t, p, d, 1.5), [x], "cpu")
        dev = _grads(lambda t, d=dim: torch.renorm(t, p, d, 1.5), [x], "neuron")
        assert (cpu[0].isnan() == dev[0].isnan()).all()  # NaN where the CPU's is (p=inf)
        assert torch.equal(cpu[0].nan_to_num(), dev[0].nan_to_num()), (dim, cpu[0] - dev[0])


def test_renorm_second_order_gradient_runs_on_device_ops_within_float32():
    x = (torch.randn(4, 6, generator=torch.Generator().manual_seed(6)) * 2).requires_grad_()
    cpu = _grads(lambda t: torch.renorm(t, 2, 1, 1.5), [x], "cpu", create_graph=True)
    dev = _grads(lambda t: torch.renorm(t, 2, 1, 1.5), [x], "neuron", create_graph=True)
    for c, d in zip(cpu, dev, strict=True):
        torch.testing.assert_close(d, c)


@pytest.mark.slow  # torch.compile: the traced backward graph holds the one host op
def test_compiled_renorm_gradient_is_the_cpus():
    # renorm has no device kernel: a compiled graph runs it on the host only when asked to
    x = (torch.randn(4, 6, generator=torch.Generator().manual_seed(7)) * 2).requires_grad_()
    compiled = torch.compile(lambda t: torch.renorm(t, 2, 0, 1.5), backend="neuron",
                             dynamic=False, options={"fallback": True})  # fmt: skip
    cpu = _grads(lambda t: torch.renorm(t, 2, 0, 1.5), [x], "cpu")
    dev = _grads(compiled, [x], "neuron")
    assert torch.equal(cpu[0], dev[0])


def test_torch_func_transforms_and_forward_ad_take_torchs_own_autograd():
    # the Functions define no vmap rule or jvp: under torch.func and forward-mode AD torch's own
    # kernels run (the CPU takes the subclass branch there too), with the CPU's numbers
    from torch.autograd import forward_ad
    from torch.func import grad, jacfwd, jacrev, jvp, vmap

    x = torch.tensor([1.0, 2.0, 3.0, 0.5])
    cases = {
        "grad": lambda t: grad(lambda u: u.prod() + u.masked_fill(u > 2, u[0]).sum())(t),
        "vmap": lambda t: vmap(lambda u: u.prod())(t.view(2, 2)),
        "jvp": lambda t: jvp(lambda u: u.cumprod(0), (t,), (torch.ones_like(t),))[1],
        "jacrev": lambda t: jacrev(lambda u: u.cumprod(0))(t),
        "jacfwd": lambda t: jacfwd(lambda u: u.prod(0))(t),
    }
    for name, fn in cases.items():
        assert torch.equal(fn(x.to("neuron")).cpu(), fn(x)), name
    renorm = grad(lambda u: torch.renorm(u.view(2, 2), 2, 0, 1.0).sum())
    torch.testing.assert_close(renorm(x.to("neuron")).cpu(), renorm(x))
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x.to("neuron"), torch.ones(4).to("neuron"))
        tangent = forward_ad.unpack_dual(dual.prod()).tangent
    assert tangent.item() == 11.5  # sum over i of the product of the others

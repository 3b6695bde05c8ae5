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

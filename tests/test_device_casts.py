"""Casts on the device (`aten::_to_copy` with a dtype only: autocast's, `.float()`, `.to(dtype)`):
the values, strides, autograd, compile-cache counts and memory of a CPU run's casts, whichever
path runs them (dispatch._cast while nothing records, the plain path while a profiler does),
and a kernel with its modeled cost in the profile."""

from __future__ import annotations

import pytest
import torch

from neuron_explorer import backend
from neuron_explorer.backend.tensor import wrap

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
CASTS = [(F32, BF16), (BF16, F32), (F32, F16), (F16, BF16), (torch.int64, F32), (F32, torch.int32)]


def _source(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g) * 1000
    return x.to(dtype)


@pytest.mark.parametrize(("src", "dst"), CASTS, ids=lambda d: str(d).removeprefix("torch."))
def test_a_cast_equals_the_cpus_bitwise(src, dst):
    x = _source(src)
    for view in (x, x.t(), x[:, ::3]):  # contiguous, transposed (strides kept), strided
        out = view.to("neuron").to(dst)
        ref = view.to(dst)
        assert out.device.type == "neuron" and out.dtype == dst
        assert out.stride() == ref.stride() and torch.equal(out.cpu(), ref)


def test_the_keyword_forms_of_a_cast_equal_the_cpus():
    x = _source(F32)
    d = x.to("neuron")
    forms = [
        (d.to(device=d.device, dtype=BF16), x.to(dtype=BF16)),  # Llama's rotary embedding
        # ToCopyBackward's own call
        (torch.ops.aten._to_copy(d, dtype=BF16, layout=torch.strided, device=d.device), x.to(BF16)),
        (d.half(), x.half()),
        (d.t().to(BF16, memory_format=torch.contiguous_format), x.t().contiguous().to(BF16)),
        (d.to(F32, copy=True), x.clone()),
    ]
    for out, ref in forms:
        assert out.device.type == "neuron" and out.stride() == ref.stride()
        assert torch.equal(out.cpu(), ref)
    copy = d.to(F32, copy=True)  # an unchanged dtype is still a fresh tensor
    assert copy._payload.data_ptr() != d._payload.data_ptr()


def test_a_cast_to_float64_stays_float32_precise():
    x = torch.tensor([1 / 3], dtype=F32).to("neuron")
    with pytest.warns(UserWarning, match="float64 is computed as float32"):
        backend.runtime.tracking._f64_warned = False
        y = x.double()
    assert y.dtype == torch.float64 and y.item() == float(torch.tensor(1 / 3, dtype=F32))


def test_a_cast_of_a_leaf_parameter_keeps_its_gradient_in_the_parameters_dtype():
    w = torch.randn(5, 3).to("neuron").requires_grad_()
    w_cpu = w.detach().cpu().requires_grad_()
    for t in (w, w_cpu):
        y = t.to(BF16)
        assert y.grad_fn.name() == "ToCopyBackward0"
        (y.float() * torch.arange(3.0, device=t.device)).sum().backward()
    assert w.grad.dtype == F32 and torch.equal(w.grad.cpu(), w_cpu.grad)


def test_a_cast_under_inference_mode_is_an_inference_tensor_and_keeps_working():
    x = torch.randn(4, 4).to("neuron")
    with torch.inference_mode():
        y = x.to(device=x.device, dtype=BF16)
        assert y.is_inference() and not x.is_inference()
        z = (y * 2).float()
    assert z.device.type == "neuron" and torch.equal(z.cpu(), (x.cpu().to(BF16) * 2).float())


def test_casts_count_in_the_compile_cache_and_in_device_memory():
    x = torch.ones(37, 11, device="neuron")  # a shape no other test casts
    backend.reset_compile_stats()
    before = torch.neuron.memory_allocated()
    outs = [x.to(BF16) for _ in range(3)]
    s = backend.compile_stats()
    assert (s.eager_compiles, s.eager_cache_hits) == (1, 2)
    assert torch.neuron.memory_allocated() - before == 3 * 37 * 11 * 2
    assert "aten::_to_copy" in backend.get_executed_ops()
    del outs
    assert torch.neuron.memory_allocated() == before


def test_a_cast_under_the_profiler_is_a_kernel_with_its_modeled_cost():
    x = torch.randn(64, 32).to("neuron")
    x.to(BF16)  # compiled before recording
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        y = x.to(BF16)
        with torch.autocast("neuron", dtype=BF16):
            z = torch.mm(x, x.t())
    events = backend.events.drain()
    casts = [e for e in events if e.kind == "kernel" and e.op_name == "aten::_to_copy"]
    assert len(casts) == 3  # the explicit one, then autocast's of both mm operands
    assert all(e.device_dur_ns > 0 for e in casts)
    assert y.dtype == z.dtype == BF16


@pytest.mark.parametrize(
    ("shape", "strides"),
    [((1, 4), (1, 1)), ((4, 1), (1, 7)), ((0, 3), (1, 1)), ((2, 1, 3), (3, 9, 1)), ((), ())],
    ids=str,
)
def test_a_cast_keeps_the_strides_of_size_0_and_1_dimensions(shape, strides):
    # is_contiguous ignores those dimensions' strides: a wrapper built without strides would
    # get the row-major ones and differ from the CPU's
    x = torch.empty_strided(shape, strides).copy_(torch.arange(float(max(1, len(shape)))).sum())
    for dst in (BF16, F16):
        ref, out = x.to(dst), wrap(x).to(dst)
        assert out.stride() == ref.stride() and out.shape == ref.shape
        assert torch.equal(out.cpu(), ref)
    w = wrap(x)
    assert w.stride() == x.stride() and w.storage_offset() == 0


def test_a_wrapper_keeps_offset_grad_and_inference_like_its_payload():
    x = torch.arange(24.0).reshape(4, 6)
    for view in (x[1:], x[:, 2:], x.t(), x[1:, 1:].t()):
        w = wrap(view)
        assert (w.stride(), w.storage_offset(), w.shape) == (
            view.stride(),
            view.storage_offset(),
            view.shape,
        )
    leaf = torch.randn(3, 4, device="neuron", requires_grad=True)
    assert leaf.requires_grad and leaf.is_leaf and leaf.stride() == (4, 1)
    with torch.inference_mode():
        cast = leaf.detach().to(BF16)
        assert cast.is_inference() and cast.stride() == (4, 1)

"""The device's eager compile cache: a kernel is kept by its op and its inputs' shapes and
dtypes, and a call of the same op and shapes whose plan differs (its outputs: a backward's
output mask; a matmul's operand layout: a transposed A needs no transposes on TensorE) gets a
kernel of its own, costed as if it ran alone, not the first call's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from neuron_explorer import backend
from neuron_explorer.backend.runtime import tracking


def _durations(fn, op: str) -> list[int]:
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        fn()
        torch.neuron.synchronize()
    return [e.device_dur_ns for e in backend.events.drain()
            if e.kind == "kernel" and e.op_name == op]  # fmt: skip


def _alone(fn, op: str) -> list[int]:
    tracking.clear_compile_cache()
    return _durations(fn, op)


def test_a_matmul_of_the_same_shapes_and_another_layout_is_its_own_kernel():
    a = torch.randn(512, 256, device="neuron")
    at = torch.randn(256, 512, device="neuron").t()  # the same shape, column-major
    b = torch.randn(256, 384, device="neuron")
    plain, = _alone(lambda: torch.mm(a, b), "aten::mm")  # fmt: skip
    transposed, = _alone(lambda: torch.mm(at, b), "aten::mm")  # fmt: skip
    assert transposed < plain  # K-major A: no transposes on TensorE
    tracking.clear_compile_cache()
    assert _durations(lambda: (torch.mm(a, b), torch.mm(at, b)), "aten::mm") == [plain, transposed]
    assert _durations(lambda: (torch.mm(at, b), torch.mm(a, b)), "aten::mm") == [transposed, plain]


def test_a_backward_with_another_output_mask_is_its_own_kernel():
    op = "aten::native_layer_norm_backward"
    w = torch.ones(256, device="neuron", requires_grad=True)

    def backward(input_grad: bool):
        x = torch.randn(64, 256, device="neuron", requires_grad=input_grad)
        out = F.layer_norm(x, (256,), w)
        return lambda: out.sum().backward()

    full, = _alone(backward(True), op)  # fmt: skip
    params_only, = _alone(backward(False), op)  # fmt: skip
    assert params_only < full  # no input gradient to compute and write
    tracking.clear_compile_cache()
    assert _durations(backward(True), op) == [full]
    assert _durations(backward(False), op) == [params_only]

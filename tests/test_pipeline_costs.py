"""What a modeled pipeline's later stages compute and stage 0 does not (backend/pipeline_costs.py),
priced on meta tensors, against the kernels the neuron device records when it runs the same
stage: its input's gradient (matmuls, bmm and elementwise ops), the last stage's loss."""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn as nn

from neuron_explorer import backend
from neuron_explorer.backend import pipeline_costs
from neuron_explorer.backend.runtime import tracking


class Stage(nn.Module):
    """A stage whose input meets elementwise ops and a bmm with a buffer before any parameter
    (none of which records an autograd node on stage 0), then a norm, a Linear and a bmm with
    a parameter."""

    def __init__(self, dim: int = 256, keys: int = 192) -> None:
        super().__init__()
        self.register_buffer("key", torch.randn(4, dim, keys) / dim)
        self.norm = nn.LayerNorm(keys)
        self.proj = nn.Linear(keys, dim)
        self.mix = nn.Parameter(torch.randn(4, dim, dim) / dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(x * 0.5)
        h = self.proj(self.norm(torch.bmm(x, self.key).softmax(-1)))
        return torch.bmm(nn.functional.gelu(h), self.mix)


def _recorded(fn) -> list:
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        fn()
        torch.neuron.synchronize()
    return [e for e in backend.events.drain() if e.kind == "kernel"]


def _backward_kernels(stage: nn.Module, input_grad: bool) -> list:
    """The kernels of the stage's backward on the device, its input needing a gradient (a
    later stage's) or not (stage 0's), from a gradient of its output as the next stage sends;
    its parameters hold no gradient before (a step's first micro-batch: nothing to add to)."""
    stage.zero_grad(set_to_none=True)
    # each rank lowers its own kernels (and compiles them on first use)
    tracking.clear_compile_cache()
    x = torch.randn(4, 128, 256, device="neuron").requires_grad_(input_grad)
    out = stage(x)
    grad = torch.ones_like(out)
    torch.neuron.synchronize()
    return _recorded(lambda: torch.autograd.backward(out, grad))


def test_a_later_stage_adds_the_kernels_of_its_inputs_gradient_that_stage_0_skips():
    torch.manual_seed(0)
    stage = Stage().to("neuron")
    later, first = _backward_kernels(stage, True), _backward_kernels(stage, False)
    added = Counter(e.op_name for e in later) - Counter(e.op_name for e in first)
    # what is before the norm (elementwise ops, the input's bmm, the softmax) is all added,
    # and the norm's input gradient; after it, the inputs need a gradient on stage 0 too
    elementwise = {"aten::mul", "aten::tanh_backward", "aten::_softmax_backward_data"}
    assert Counter(e.op_name for e in later)["aten::native_layer_norm_backward"] == 1
    assert {"aten::bmm", *elementwise} <= set(added) and "aten::mm" not in added, added
    real_ns = sum(e.device_dur_ns for e in later) - sum(e.device_dur_ns for e in first)
    x = torch.randn(4, 128, 256, device="neuron")
    assert real_ns > 0
    assert pipeline_costs.input_grad_ns(stage, (x,), {}) == real_ns


def test_a_stage_whose_input_meets_a_linear_first_adds_its_matmul_only():
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(256, 384), nn.Tanh(), nn.Linear(384, 256)).to("neuron")
    later, first = _backward_kernels(stage, True), _backward_kernels(stage, False)
    added = Counter(e.op_name for e in later) - Counter(e.op_name for e in first)
    assert added == Counter({"aten::mm": 1}), added
    x = torch.randn(4, 128, 256, device="neuron")
    priced = pipeline_costs.input_grad_ns(stage, (x,), {})
    assert priced == sum(e.device_dur_ns for e in later) - sum(e.device_dur_ns for e in first)


def test_the_last_stage_loss_is_priced_as_the_device_runs_it():
    """mse_loss on an output against a target of its shape, forward then backward from
    `ones_like` of the loss, as a schedule's last stage runs it."""
    out = torch.randn(1024, 512, device="neuron", requires_grad=True)
    target = torch.randn(1024, 512, device="neuron")
    loss: list = []
    forward = _recorded(lambda: loss.append(nn.functional.mse_loss(out, target)))
    backward = _recorded(lambda: loss[0].backward())
    priced = pipeline_costs.loss_ns(nn.functional.mse_loss, out)
    assert {e.op_name for e in backward} >= {"aten::ones_like", "aten::mse_loss_backward"}
    assert priced[:2] == (
        sum(e.device_dur_ns for e in forward),
        sum(e.device_dur_ns for e in backward),
    )

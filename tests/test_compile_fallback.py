"""A compiled graph with ops the device cannot lower (issue 28): the compile fails by default
naming each op and its line; with the opt-in the graph is split around them, each a recorded
CPU fallback between device programs."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import neuron_explorer
from neuron_explorer import backend


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    backend.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    torch._dynamo.reset()


def spectrum(x):
    y = torch.fft.fft(x * 2)  # the host op
    return y.abs() + 1


def _events(kind: str, compile_fn):
    backend.events.clear()
    with torch.profiler.profile():
        out = compile_fn()
    return out, [e for e in backend.events.drain() if e.kind == kind]


def test_an_op_the_device_cannot_lower_fails_the_compile_naming_it_and_its_line():
    x = torch.randn(4, 16)
    compiled = torch.compile(spectrum, backend="neuron", dynamic=False)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as err:
        compiled(x.to("neuron"))
    message = str(err.value)
    line = spectrum.__code__.co_firstlineno + 1
    assert "aten::_fft_r2c" in message and f"{__file__}:{line}" in message
    assert 'options={"fallback": True}' in message and "NEURON_COMPILE_FALLBACK=1" in message


def test_the_opt_in_runs_the_op_on_the_host_as_a_recorded_fallback_between_device_programs():
    x = torch.randn(4, 16)
    compiled = torch.compile(spectrum, backend="neuron", dynamic=False, options={"fallback": True})
    compiled(x.to("neuron"))  # compile outside the capture
    backend.events.clear()
    with torch.profiler.profile():
        out = compiled(x.to("neuron"))
    events = backend.events.drain()
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), spectrum(x), rtol=0, atol=0)
    fallbacks = [e for e in events if e.kind == "fallback"]
    assert [e.op_name for e in fallbacks] == ["aten::_fft_r2c"]
    assert fallbacks[0].src_file == __file__
    assert fallbacks[0].src_line == spectrum.__code__.co_firstlineno + 1
    # no longer priced as a device kernel: the device runs the parts before and after it
    kernels = [e for e in events if e.kind == "kernel"]
    assert all("fft" not in k.name for k in kernels)
    assert {k.name for k in kernels} == {"mul", "fused_abs_add"}
    assert len({k.args["neff"] for k in kernels}) == 2  # one NEFF each side of the host op
    copies = [e.name for e in events if e.kind == "copy" and e.op_name == "aten::_fft_r2c"]
    assert copies == ["copy d2h", "copy h2d"]
    assert backend.get_fallback_ops() == ["aten::_fft_r2c"]


def test_the_environment_variable_opts_in_too(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "1")
    x = torch.randn(4, 16)
    out = torch.compile(spectrum, backend="neuron", dynamic=False)(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), spectrum(x), rtol=0, atol=0)
    assert backend.get_fallback_ops() == ["aten::_fft_r2c"]


@torch.library.custom_op("neuron_explorer_tests::soft_clip", mutates_args=())
def soft_clip(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 3


@soft_clip.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_custom_op_without_a_device_kernel_is_refused_then_a_recorded_fallback():
    x = torch.randn(8)

    def f(t):
        return soft_clip(t + 1) * 2

    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="soft_clip"):
        torch.compile(f, backend="neuron", dynamic=False)(x.to("neuron"))
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="neuron", dynamic=False, options={"fallback": True})
    out, fallbacks = _events("fallback", lambda: compiled(x.to("neuron")))
    torch.testing.assert_close(out.cpu(), f(x), rtol=0, atol=0)
    assert [e.op_name for e in fallbacks] == ["neuron_explorer_tests::soft_clip"]
    assert fallbacks[0].src_line == f.__code__.co_firstlineno + 1


def test_training_through_a_host_op_matches_cpu_with_the_backward_split_too():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(16, 16), nn.Tanh())

    def loss(m, x):
        return torch.fft.rfft(m(x)).abs().sum()

    dev = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    x = torch.randn(4, 16)
    compiled = torch.compile(loss, backend="neuron", dynamic=False, options={"fallback": True})
    compiled(dev, x.to("neuron")).backward()
    loss(cpu, x).backward()
    torch.testing.assert_close(dev[0].weight.grad.cpu(), cpu[0].weight.grad)
    assert {"aten::_fft_r2c"} <= set(backend.get_fallback_ops())


@torch.library.custom_op("neuron_explorer_tests::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 3


@scaled_tanh.register_fake
def _(x):
    return torch.empty_like(x)


def test_a_registered_kernel_runs_a_custom_op_on_the_device_at_its_declared_cost():
    x = torch.randn(64, 32)
    scaled_tanh(x.to("neuron"))  # before the declaration: a fallback
    assert backend.get_fallback_ops() == ["neuron_explorer_tests::scaled_tanh"]
    neuron_explorer.register_kernel(scaled_tanh, flops=lambda s: 5 * s[0] * s[1], engine="ScalarE")
    backend.clear_op_tracking()
    out, kernels = _events("kernel", lambda: scaled_tanh(x.to("neuron")))
    assert torch.equal(out.cpu(), scaled_tanh(x)) and backend.get_fallback_ops() == []
    (kernel,) = [k for k in kernels if k.op_name == "neuron_explorer_tests::scaled_tanh"]
    assert kernel.flops == 5 * 64 * 32 and kernel.src_file == __file__

    def f(t):
        return scaled_tanh(t + 1) * 2

    compiled = torch.compile(f, backend="neuron", dynamic=False)  # no opt-in needed now
    compiled(x.to("neuron"))
    out, kernels = _events("kernel", lambda: compiled(x.to("neuron")))
    torch.testing.assert_close(out.cpu(), f(x), rtol=0, atol=0)
    # its own kernel in the NEFF: the compiler fuses nothing into a user's kernel
    assert [k.name for k in kernels] == ["add", "scaled_tanh", "mul"]
    assert kernels[1].flops == 5 * 64 * 32
    assert kernels[1].src_line == f.__code__.co_firstlineno + 1
    assert backend.get_fallback_ops() == []

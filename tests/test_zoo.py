"""Model-zoo conformance (issue 11): real models train, run inference and compile on the neuron
device with the CPU's numbers.

Each zoo model (tests/zoo_models.py) trains 2 AdamW steps equal to the CPU (bitwise, or within
the model's stated tolerance), runs generate() (decoders) or a forward under
torch.inference_mode() equal to the CPU, and the decoders compile with
torch.compile(backend="neuron", dynamic=False) and with model.compile() after
torch.compiler.set_default_backend("neuron"), equal to CPU eager, recording a recompile when the
batch size changes. A few tiny models run by default; `pytest -m sweep tests/test_zoo.py` runs
the whole zoo.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from zoo_models import ZOO, built, inputs, on, train

import neuron_explorer.backend as backend

pytest.importorskip("transformers")

DEFAULT_TRAIN = ("gpt2", "lstm", "fft")
DEFAULT_INFER = ("llama", "gru")
DEFAULT_COMPILE = ("gpt2",)
COMPILE_ATOL = 1e-5  # compiled graphs run the same aten ops; fusion leaves the math alone


def _marks(names: tuple[str, ...], default: tuple[str, ...]) -> list:
    return [
        pytest.param(n, marks=[pytest.mark.slow] if n in default else [pytest.mark.sweep])
        for n in names
    ]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' config notes, the fallback notices
        yield


@pytest.mark.parametrize("name", _marks(tuple(ZOO), DEFAULT_TRAIN))
def test_trains_two_steps_like_cpu(name):
    model = ZOO[name]
    dev_losses, dev_params = train(model, "neuron")
    assert set(backend.get_fallback_ops()) == set(model.fallbacks)
    cpu_losses, cpu_params = train(model, "cpu")
    worst = max((a - b).abs().max().item() for a, b in zip(dev_params, cpu_params, strict=True))
    if model.atol == 0:
        assert dev_losses == cpu_losses
        assert worst == 0.0, f"{name}: parameters differ by {worst:.3g} after 2 steps"
    else:
        assert dev_losses == pytest.approx(cpu_losses, rel=model.atol)
        assert worst <= model.atol, f"{name}: {worst:.3g} > {model.atol} ({model.why})"


@pytest.mark.parametrize("name", _marks(tuple(ZOO), ("llama", "gru")))
def test_trains_under_the_profiler_like_cpu(name):
    # the recorded dispatch path (kernel records, restrides, composites) gives the same numbers
    model = ZOO[name]
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        dev_losses, dev_params = train(model, "neuron", 1)
    kernels = [e for e in backend.events.drain() if e.kind == "kernel"]
    cpu_losses, cpu_params = train(model, "cpu", 1)
    assert kernels
    if model.atol:
        assert dev_losses == pytest.approx(cpu_losses, rel=model.atol)
    else:
        assert dev_losses == cpu_losses
        assert all(torch.equal(a, b) for a, b in zip(dev_params, cpu_params, strict=True))
    # attention without dropout is one fused kernel; GPT-2 and BERT train with attention
    # dropout, where the CPU (so the device) takes SDPA's math path
    if name in ("llama", "mistral", "mixtral", "vit", "whisper"):
        assert any(e.name.startswith("flash_attention") for e in kernels)


AUTOCAST = ("gpt2", "llama", "vit", "resnet")


@pytest.mark.parametrize("name", _marks(AUTOCAST, ("gpt2",)))
def test_bf16_autocast_training_tracks_cpu_autocast(name):
    # bf16 matmuls accumulate in fp32 and round once on the device; the CPU's bf16 kernels
    # round partial sums their own way: the loss agrees to bf16 precision and each gradient
    # within 3% of its norm (one bf16 ulp is 0.8%); one step, as AdamW's normalised update
    # turns any tiny gradient difference into a full lr-sized parameter difference
    model = ZOO[name]
    dev_losses, dev_grads = train(model, "neuron", 1, autocast=torch.bfloat16, grads=True)
    assert set(backend.get_fallback_ops()) == set(model.fallbacks)
    cpu_losses, cpu_grads = train(model, "cpu", 1, autocast=torch.bfloat16, grads=True)
    assert dev_losses == pytest.approx(cpu_losses, rel=2e-3)
    total = torch.cat([g.flatten() for g in cpu_grads]).norm()
    for a, b in zip(dev_grads, cpu_grads, strict=True):
        assert a.dtype == b.dtype == torch.float32
        # a gradient that nearly cancels (a bias before a norm) is judged on the model's scale
        assert (a - b).norm() <= 0.03 * b.norm() + 1e-3 * total


def _infer(name: str, device: str):
    model = ZOO[name]
    net = built(model, device)
    batch = on(inputs(model), device)
    with torch.inference_mode():
        if model.decoder:
            return net.generate(**batch, max_new_tokens=4, do_sample=False).cpu()
        return net(**batch).logits.cpu()


@pytest.mark.parametrize("name", _marks(tuple(ZOO), DEFAULT_INFER))
def test_inference_mode_like_cpu(name):
    backend.clear_op_tracking()
    dev = _infer(name, "neuron")
    assert set(backend.get_fallback_ops()) <= set(ZOO[name].fallbacks)
    cpu = _infer(name, "cpu")
    assert dev.shape == cpu.shape
    if ZOO[name].decoder:
        assert torch.equal(dev, cpu), f"{name}: generate() chose other tokens"
    else:
        torch.testing.assert_close(dev, cpu, atol=ZOO[name].atol, rtol=ZOO[name].atol)


# Mixtral's experts compile as transformers' custom op grouped_mm_fallback, a TensorE grouped
# matmul on the device (backend/library_kernels.py): no host fallback to opt into (issue 28)
COMPILED = ("gpt2", "llama", "mistral", "mixtral", "bert", "t5")


def _compiled_run(name: str, compile_model) -> tuple[list, list, int]:
    """Logits compiled on the device and in CPU eager at batch 2 then 1; recompiles counted."""
    model = ZOO[name]
    torch._dynamo.reset()
    cpu = built(model, "cpu")
    dev = compile_model(built(model, "neuron"))
    before = backend.compile_stats().graph_recompiles
    got, want = [], []
    with torch.no_grad():
        for n in (2, 1):
            batch = inputs(model, n)
            got.append(dev(**on(batch, "neuron")).logits.cpu())
            want.append(cpu(**batch).logits)
    return got, want, backend.compile_stats().graph_recompiles - before


@pytest.mark.parametrize("name", _marks(COMPILED, DEFAULT_COMPILE))
def test_torch_compile_backend_neuron_like_cpu_eager(name):
    got, want, recompiles = _compiled_run(
        name,
        lambda m: torch.compile(m, backend="neuron", dynamic=False),
    )
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=COMPILE_ATOL, rtol=COMPILE_ATOL)
    assert recompiles >= 1, "a new batch size must record a recompile"


@pytest.mark.parametrize("name", _marks(COMPILED, ()))
def test_model_compile_with_default_backend_like_cpu_eager(name):
    previous = torch.compiler.get_default_backend()
    torch.compiler.set_default_backend("neuron")
    try:

        def compile_model(m):
            m.compile()
            return m

        got, want, recompiles = _compiled_run(name, compile_model)
    finally:
        torch.compiler.set_default_backend(previous)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=COMPILE_ATOL, rtol=COMPILE_ATOL)
    assert recompiles >= 1, "a new batch size must record a recompile"

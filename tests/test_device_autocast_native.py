"""`torch.autocast("neuron")`'s C++ kernels (runtime/autocast.cpp) against the Python kernels
they replace (runtime/autocast.py, the fallback without a compiler or with
NEURON_PYTHON_AUTOCAST=1): the same lists and cast rule, bitwise the same values, on single ops
with mixed operands and on real tiny GPT-2 and Llama autocast training; torch's weight-cast
cache (generate() included); nesting and enabled=False; casts still kernels under the profiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from zoo_models import ZOO, built, inputs, on

from neuron_explorer import backend
from neuron_explorer.backend.runtime import autocast

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
ROOT = Path(__file__).resolve().parents[1]
NATIVE = pytest.mark.skipif(
    shutil.which("g++") is None or os.environ.get("NEURON_PYTHON_AUTOCAST") == "1",
    reason="no C++ compiler, or the Python kernels asked for",
)


def _rand(*shape, dtype=F32, device="neuron"):
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    return torch.randn(*shape, generator=g).to(dtype).to(device)


def _cases():
    """(op, args) of both lists with the operands the rule tells apart: fp32, bf16, float64,
    integer and neuron/CPU-scalar tensors, and keyword arguments."""
    a, b, bias = _rand(4, 6), _rand(6, 5), _rand(5)
    x16, x64 = _rand(3, 7, dtype=BF16), _rand(3, 7, dtype=torch.float64)
    img, kernel = _rand(1, 2, 5, 5), _rand(3, 2, 3, 3)
    cpu_scalar = torch.tensor(2.5, dtype=torch.float64)  # cast (the Python kernel's rule)
    aten = torch.ops.aten
    return [
        (aten.mm.default, (a, b)),
        (aten.addmm.default, (bias, a, b)),
        (aten.addmm.default, (bias.to(BF16), a, b.to(torch.float64))),
        (aten.bmm.default, (_rand(2, 3, 4), _rand(2, 4, 2))),
        (aten.linear.default, (a, b.t(), bias)),
        (aten.conv2d.default, (img, kernel)),
        (aten.scaled_dot_product_attention.default, (_rand(1, 2, 4, 8),) * 3),
        (aten.softmax.int, (x16, -1)),
        (aten.log_softmax.int, (x64, 1)),
        (aten.layer_norm.default, (x16, [7], _rand(7), _rand(7, dtype=BF16))),
        (aten.sum.default, (x16,)),
        (aten.sum.dim_IntList, (x16, [0], True)),
        (aten.sum.default, (_rand(3, 7).to(torch.int64),)),
        (aten.pow.Tensor_Tensor, (x16.abs(), cpu_scalar)),
        (aten.cumsum.default, (x16, 1)),
        (aten.exp.default, (x64,)),
    ]


@NATIVE
def test_the_native_kernels_are_registered_where_a_compiler_is():
    assert autocast.kind == "native"


def _python_kernel(op):
    for _name, overload, dtype in autocast._overloads():
        if overload is op:
            return autocast._kernel(op, dtype)
    raise AssertionError(f"{op} is in neither list")


@NATIVE
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_each_listed_op_equals_the_python_kernel_bitwise(dtype):
    """The dispatcher's kernel (C++) and the Python kernel called directly, same arguments."""
    for op, args in _cases():
        with torch.autocast("neuron", dtype=dtype):
            native = op(*args)
            python = _python_kernel(op)(*args)
        assert native.dtype == python.dtype, op
        assert native.device.type == "neuron", op
        assert torch.equal(native.cpu(), python.cpu()), op


def test_the_lists_cast_to_the_autocast_dtype_and_to_float32():
    a, b = _rand(4, 6), _rand(6, 5)
    with torch.autocast("neuron", dtype=BF16):
        assert torch.mm(a, b).dtype == BF16
        assert F.linear(a, b.t()).dtype == BF16
        assert torch.softmax(a.to(BF16), -1).dtype == F32
        assert a.to(BF16).sum().dtype == F32
        assert torch.mm(a.double(), b.double()).dtype == BF16  # float64 too, as before
        assert (a + b[:4, :1]).dtype == F32  # unlisted: untouched


def test_out_overloads_fall_through_and_write_their_out():
    a, b = _rand(4, 6), _rand(6, 5)
    out = torch.zeros(4, 5, device="neuron")
    with torch.autocast("neuron", dtype=BF16):
        torch.mm(a, b, out=out)
    assert torch.equal(out.cpu(), torch.mm(a.cpu(), b.cpu()))


def test_nesting_and_disabled_regions():
    a, b = _rand(4, 6), _rand(6, 5)
    with torch.autocast("neuron", dtype=BF16):
        with torch.autocast("neuron", enabled=False):
            assert torch.mm(a, b).dtype == F32
        with torch.autocast("neuron", dtype=F16):
            assert torch.mm(a, b).dtype == F16
        assert torch.mm(a, b).dtype == BF16
    assert torch.mm(a, b).dtype == F32


def _weight_cast(y: torch.Tensor, w: torch.Tensor):
    """The ToCopyBackward node in y's graph whose input is the leaf w (w's autocast cast)."""
    todo, seen = [y.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        inputs = [n for n, _ in node.next_functions if n is not None]
        if node.name() == "ToCopyBackward0" and any(
            getattr(n, "variable", None) is w for n in inputs
        ):
            return node
        todo.extend(inputs)
    return None


@NATIVE
def test_a_weight_is_cast_once_per_autocast_region():
    # small integers: every bf16 product and sum is exact, so the gradient equals CPU autocast's
    w = torch.nn.Parameter(_rand(5, 6).round())
    x = _rand(4, 6).round()
    with torch.autocast("neuron", dtype=BF16):
        y1 = F.linear(x, w)
        with torch.autocast("neuron", enabled=False):  # an inner exit keeps the cache
            pass
        y2 = F.linear(x, w)
    with torch.autocast("neuron", dtype=BF16):
        y3 = F.linear(x, w)
    casts = [_weight_cast(y, w) for y in (y1, y2, y3)]
    assert all(c is not None for c in casts)
    assert casts[0] is casts[1] and casts[2] is not casts[0]
    (y1.sum() + y2.sum() + y3.sum()).backward()  # the shared cast's gradient counts twice
    ref = torch.nn.Parameter(w.detach().cpu())
    with torch.autocast("cpu", dtype=BF16):
        sum(F.linear(x.cpu(), ref).sum() for _ in range(3)).backward()
    assert torch.equal(w.grad.cpu(), ref.grad)


def _cpu_casts(mode, x, w) -> int:
    """CPU autocast's `_to_copy` count for three F.linear(x, w) under `mode`."""
    with mode(), torch.profiler.profile() as prof:
        with torch.autocast("cpu", dtype=BF16):
            for _ in range(3):
                F.linear(x, w)
    return sum(1 for e in prof.events() if e.name == "aten::_to_copy")


@NATIVE
@pytest.mark.parametrize("mode", [torch.enable_grad, torch.no_grad, torch.inference_mode])
def test_autocast_casts_are_kernels_under_the_profiler_as_many_as_on_the_cpu(mode):
    """Training and no_grad (generate()'s mode) cast the weight once a region, as the CPU's
    cache does; inference_mode casts it every time, as the CPU does."""
    w = torch.nn.Parameter(_rand(8, 6))
    x = _rand(4, 6)
    with torch.autocast("neuron", dtype=BF16):
        F.linear(x, w)  # compiled before recording
    backend.events.clear()
    with mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with torch.autocast("neuron", dtype=BF16):
            for _ in range(3):
                F.linear(x, w)
    events = backend.events.drain()
    casts = [e for e in events if e.kind == "kernel" and e.op_name == "aten::_to_copy"]
    assert len(casts) == _cpu_casts(mode, x.cpu(), torch.nn.Parameter(w.detach().cpu()))
    assert len(casts) == (6 if mode is torch.inference_mode else 4)  # x three times, then w
    assert all(e.device_dur_ns > 0 for e in casts)


def _generate_casts(net, batch) -> tuple[torch.Tensor, int]:
    """GPT-2 generate() of 4 tokens under bf16 autocast, profiled: the tokens and the casts."""
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with torch.autocast("neuron", dtype=BF16):
            out = net.generate(**batch, max_new_tokens=4, do_sample=False)
    events = backend.events.drain()
    return out.cpu(), sum(1 for e in events if e.kind == "kernel" and e.op_name == "aten::_to_copy")


@NATIVE
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Warning only once for all operators")  # the override
def test_generate_under_autocast_casts_each_weight_once_with_the_same_tokens():
    """generate() runs under no_grad, where torch's cache keeps each weight's cast for the
    region: the C++ kernels cast fewer times than the Python ones (registered over them for
    one call, then dropped), and the tokens are the same."""
    net = built(ZOO["gpt2"], "neuron")
    batch = on(inputs(ZOO["gpt2"]), "neuron")
    _generate_casts(net, batch)  # compiled before recording
    native_tokens, native_casts = _generate_casts(net, batch)
    lib = torch.library.Library("aten", "IMPL")
    for name, op, dtype in autocast._overloads():
        lib.impl(name, autocast._kernel(op, dtype), "AutocastPrivateUse1")
    python_tokens, python_casts = _generate_casts(net, batch)
    lib._destroy()
    assert torch.equal(native_tokens, python_tokens)
    # each of the 3 tokens after the first recasts, with the Python kernels, the 2 layers' four
    # Conv1D (addmm) weights and biases and lm_head's (tied) weight: 17 casts
    assert python_casts - native_casts == 3 * (2 * 4 * 2 + 1)


_TRAIN = """
import sys, torch
sys.path.insert(0, "tests")
from zoo_models import ZOO, train
from neuron_explorer.backend.runtime import autocast
out = {"kind": autocast.kind}
for name in ("gpt2", "llama"):
    out[name] = train(ZOO[name], "neuron", 2, autocast=torch.bfloat16)
torch.save(out, sys.argv[1])
"""


def _train_in_a_process(path: Path, **env) -> dict:
    env = {**os.environ, **env}
    r = subprocess.run([sys.executable, "-c", _TRAIN, str(path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return torch.load(path)


@NATIVE
@pytest.mark.sweep  # two models trained twice: ~10 s quiet (default suite < 15 min)
def test_gpt2_and_llama_autocast_training_equals_the_python_kernels_bitwise(tmp_path):
    python = _train_in_a_process(tmp_path / "python.pt", NEURON_PYTHON_AUTOCAST="1")
    native = _train_in_a_process(tmp_path / "native.pt", NEURON_PYTHON_AUTOCAST="0")
    assert (python["kind"], native["kind"]) == ("python", "native")
    for name in ("gpt2", "llama"):
        (py_losses, py_params), (nat_losses, nat_params) = python[name], native[name]
        assert nat_losses == py_losses
        assert len(nat_params) == len(py_params) > 10
        assert all(torch.equal(a, b) for a, b in zip(nat_params, py_params, strict=True))


@pytest.mark.slow
def test_without_a_compiler_autocast_falls_back_to_the_python_kernels(tmp_path):
    code = (
        "import torch\n"
        "from neuron_explorer.backend.runtime import autocast\n"
        "a = torch.randn(3, 4, device='neuron')\n"
        "with torch.autocast('neuron', dtype=torch.bfloat16):\n"
        "    print(autocast.kind, torch.mm(a, a.t()).dtype)\n"
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-such-g++"), "XDG_CACHE_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["python", "torch.bfloat16"]
    assert "neuron: autocast runs Python kernels" in r.stderr  # said once, at registration

"""What a porting engineer hits after ordinary float training (issue 11): inference_mode casts,
complex views, RNN cells, fused attention, bfloat16 matmuls, integer kernels the CPU lacks, and
the areas of PyTorch the device refuses with a clear error."""

from __future__ import annotations

import copy
import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neuron_explorer import backend
from neuron_explorer.backend.runtime.unsupported import NeuronUnsupportedError
from neuron_explorer.backend.tensor import NeuronTensor


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_inference_mode_to_with_the_tensors_own_device_keeps_one_wrapper():
    # Llama's rotary embedding: t.to(device=t.device, dtype=...) under inference_mode
    with torch.inference_mode():
        t = torch.randn(3, 4, device="neuron")
        for u in (t.to(device=t.device, dtype=torch.float16), t.to(t.device, torch.float16)):
            assert type(u._payload) is torch.Tensor
            assert (u + t).cpu().shape == (3, 4)
        assert t.to(t.device) is t
        host = t.to("cpu", torch.float16)
        assert type(host) is torch.Tensor and host.device.type == "cpu"
        torch.testing.assert_close(host, t.cpu().half())


def test_a_module_moves_to_the_device_inside_inference_mode():
    # torch asks _has_compatible_shallow_copy_type(cpu param, neuron param) there (issue 28)
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4)), torch.randn(2, 8)
    with torch.inference_mode():
        want = model(x)
        moved = copy.deepcopy(model).to("neuron")
        assert all(p.device.type == "neuron" for p in moved.parameters())
        torch.testing.assert_close(moved(x.to("neuron")).cpu(), want, rtol=0, atol=0)


def test_a_module_moves_to_the_device_while_a_cpu_graph_holds_its_parameters():
    # the swap of a wrapper parameter refused a tensor the graph saved ("Couldn't swap
    # Linear.weight"); CUDA assigns param.data there and works (issue 28)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    x = torch.randn(2, 4, requires_grad=True)
    cpu_loss = model(x).sum()  # its graph saves both weights
    weight = model[0].weight
    want = copy.deepcopy(model)
    model.to("neuron")
    assert model[0].weight is weight  # the same Parameter object, as with CUDA's .data =
    assert isinstance(weight, nn.Parameter) and weight.device.type == "neuron"
    model(x.detach().to("neuron")).sum().backward()
    want(x.detach()).sum().backward()
    torch.testing.assert_close(weight.grad.cpu(), want[0].weight.grad)
    with pytest.raises(RuntimeError, match="poisoned|moved to or from the neuron device"):
        cpu_loss.backward()  # the old graph no longer leads to the module's parameters


def test_a_tensor_built_from_0_dim_device_tensors_reads_each_like_item(tmp_path):
    # torch.tensor([a.max(), a.min()], device=a.device) (Qwen2-VL) reads each element with the
    # Python key excluded: the read reaches the backend key, and is a sync like .item()
    import neuron_explorer
    from neuron_explorer.model import Profile

    a = torch.randn(16)
    d = a.to("neuron")
    with neuron_explorer.profile(tmp_path / "p", wait=0, warmup=0, active=1) as prof:
        t = torch.tensor([d.max(), d.min()], device=d.device)
        prof.step()
    assert t.device.type == "neuron"
    torch.testing.assert_close(t.cpu(), torch.tensor([a.max(), a.min()]), rtol=0, atol=0)
    syncs = (
        Profile.open(tmp_path / "p")
        .duckdb()
        .execute("SELECT count(*) FROM events WHERE kind = 'sync' AND name = '.item()'")
    )
    assert syncs.fetchone()[0] == 2


def test_inference_mode_decomposes_composite_ops_instead_of_falling_back():
    x = torch.randn(2, 5, 8)
    ln = nn.LayerNorm(8)
    want = F.dropout(F.softmax(ln(x), -1), 0.1, training=False)
    ln_dev = copy.deepcopy(ln).to("neuron")
    backend.clear_op_tracking()
    with torch.inference_mode():
        got = F.dropout(F.softmax(ln_dev(x.to("neuron")), -1), 0.1, training=False)
    assert torch.equal(got.cpu(), want)
    assert backend.get_fallback_ops() == []


_COMPLEX_CASES = {
    "conj_plus_zero": lambda z: z.conj() + 0,
    "z_times_conj": lambda z: z * z.conj(),
    "exp_of_conj": lambda z: torch.exp(z.conj()),
    "imag_of_conj": lambda z: z.conj().imag * 1,  # a negative view
    "matmul_conj": lambda z: z.conj() @ z.reshape(4, 1),
}


@pytest.mark.parametrize("case", list(_COMPLEX_CASES))
def test_complex_conjugate_and_negative_views_keep_their_bits(case):
    z = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    f = _COMPLEX_CASES[case]
    zn = z.to("neuron")
    assert zn.conj().is_conj() and zn.conj()._payload.is_conj()
    assert torch.equal(f(zn).cpu(), f(z))


@pytest.mark.parametrize(
    "f", [torch.linalg.pinv, lambda a: torch.linalg.lstsq(a, a[:, :2], driver="gelsd").solution],
    ids=["pinv", "lstsq"],
)  # fmt: skip
def test_complex_fallback_keeps_the_conjugate_views_its_cpu_kernel_makes(f):
    # linalg_pinv and linalg_lstsq are CPU fallbacks whose CPU kernels conjugate lazily
    # (A.mH()); inside __torch_dispatch__ torch excludes the Conjugate key, so without putting
    # it back those bits were ignored and the results off by 0.8-2.5
    a = torch.randn(4, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(5))
    a.requires_grad_()
    d = a.detach().to("neuron").requires_grad_()
    backend.clear_op_tracking()
    got = f(d)
    assert backend.get_fallback_ops() != []  # still a fallback: the case this is about
    assert torch.equal(got.cpu(), f(a))
    (ga,) = torch.autograd.grad(f(a).abs().sum(), a)
    (gd,) = torch.autograd.grad(got.abs().sum(), d)
    assert torch.equal(gd.cpu(), ga)


def test_fft_filter_gradients_match_cpu():
    def loss(x, w):
        return torch.fft.irfft(torch.fft.rfft(x) * w, n=16).pow(2).sum()

    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(9, dtype=torch.complex64, requires_grad=True)
    loss(x, w).backward()
    xn = x.detach().to("neuron").requires_grad_()
    wn = w.detach().to("neuron").requires_grad_()
    loss(xn, wn).backward()
    assert torch.equal(wn.grad.cpu(), w.grad)
    assert torch.equal(xn.grad.cpu(), x.grad)


@pytest.mark.parametrize(
    "make", [lambda: nn.LSTM(4, 5, num_layers=2), lambda: nn.GRU(4, 5, batch_first=True),
             lambda: nn.LSTMCell(4, 5), lambda: nn.GRUCell(4, 5)],
    ids=["lstm", "gru", "lstm_cell", "gru_cell"],
)  # fmt: skip
def test_rnn_modules_train_and_infer_on_the_device(make):
    torch.manual_seed(1)
    cpu = make()
    cell = isinstance(cpu, nn.LSTMCell | nn.GRUCell)
    x = torch.randn(3, 4) if cell else torch.randn(3, 2, 4)
    dev = copy.deepcopy(cpu).to("neuron")

    def out(m, inp):
        y = m(inp)
        return y[0] if isinstance(y, tuple) else y

    want = out(cpu, x)
    want.sum().backward()
    backend.clear_op_tracking()
    got = out(dev, x.to("neuron"))
    got.sum().backward()
    assert backend.get_fallback_ops() == []
    # nn.LSTM/GRU on the CPU run oneDNN's kernel; the device runs CUDA's fused cell as device ops
    torch.testing.assert_close(got.cpu(), want, atol=1e-6, rtol=1e-6)
    for p, q in zip(cpu.parameters(), dev.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-6, rtol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(out(dev, x.to("neuron")).cpu(), want, atol=1e-6, rtol=1e-6)


_SDPA_CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "bool_mask": {"attn_mask": torch.rand(8, 8, generator=torch.Generator().manual_seed(0)) > 0.3},
    "float_mask": {"attn_mask": torch.randn(2, 1, 8, 8)},
    "dropout": {"dropout_p": 0.5},  # the CPU takes the math path: so does the device
}


@pytest.mark.parametrize("case", list(_SDPA_CASES))
def test_sdpa_takes_the_cpus_route_with_its_numbers(case):
    kw = dict(_SDPA_CASES[case])
    if "attn_mask" in kw:
        kw["attn_mask"][..., 0] = True if kw["attn_mask"].dtype == torch.bool else 0.0
    qkv = [torch.randn(2, 4, 8, 16, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def run(device):
        torch.manual_seed(0)
        ts = [t.detach().clone().to(device).requires_grad_() for t in qkv]
        dkw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        out = F.scaled_dot_product_attention(*ts, **dkw)
        out.sum().backward()
        return [out.detach().cpu()] + [t.grad.cpu() for t in ts]

    want = run("cpu")
    backend.clear_op_tracking()
    got = run("neuron")
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    fused = "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert (fused in backend.get_executed_ops()) == (case != "dropout")
    assert backend.get_fallback_ops() == []


def test_sdpa_reaches_the_device_as_one_fused_flash_attention_kernel():
    from neuron_explorer.backend.costmodel import TensorInfo, lower_op

    q = torch.randn(1, 2, 128, 64, device="neuron")
    backend.clear_op_tracking()
    with torch.inference_mode():
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert backend.get_executed_ops() == ["aten::_scaled_dot_product_flash_attention_for_cpu"]
    t = TensorInfo((1, 2, 128, 64), "float32")
    plan = lower_op("aten::_scaled_dot_product_flash_attention_for_cpu", inputs=[t, t, t],
                    outputs=[t], spec=None)  # fmt: skip
    engines = {c.engine for c in plan.computes}
    assert plan.name == "flash_attention" and plan.category == "matmul"
    assert {"TensorE", "ScalarE"} <= engines  # QK^T and PV, and the softmax in SBUF


_BF16_OPS = {
    "mm": lambda a, b, c: torch.mm(a, b),
    "bmm": lambda a, b, c: torch.bmm(a.expand(2, -1, -1), b.expand(2, -1, -1)),
    "addmm": lambda a, b, c: torch.addmm(c, a, b),
    "baddbmm": lambda a, b, c: torch.baddbmm(
        c.expand(2, -1, -1), a.expand(2, -1, -1), b.expand(2, -1, -1)
    ),  # fmt: skip
    "linear": lambda a, b, c: F.linear(a, b.t(), c[0]),
    "matmul": lambda a, b, c: a @ b,
    "conv2d": lambda a, b, c: F.conv2d(a.reshape(1, 1, 48, 48), b[:9, :4].t().reshape(4, 1, 3, 3)),
    "sdpa": lambda a, b, c: F.scaled_dot_product_attention(
        a.reshape(1, 48, 48), b.reshape(1, 48, 48), c.reshape(1, 48, 48)
    ),  # fmt: skip
}


@pytest.mark.parametrize("op", list(_BF16_OPS))
def test_bf16_matmul_class_ops_accumulate_in_fp32_and_round_once(op):
    gen = torch.Generator().manual_seed(5)
    a, b, c = (torch.randn(48, 48, generator=gen).bfloat16() for _ in range(3))
    f = _BF16_OPS[op]
    got = f(*(t.to("neuron") for t in (a, b, c)))
    assert got.dtype == torch.bfloat16
    # the TensorE's PSUM: fp32 products and sums of the bf16 operands, one rounding at the end
    assert torch.equal(got.cpu(), f(a.float(), b.float(), c.float()).bfloat16())
    torch.testing.assert_close(got.cpu(), f(a, b, c), atol=0.05, rtol=0.016)  # bf16 tolerance


def _cpu_bf16_conv_transpose2d(x, w, b):
    """What the CPU's bf16 transposed conv (SlowTranspose2d) computes, written out: a GEMM into
    bf16 columns (one rounding), then col2im adding each kernel tap into the bf16 output (a
    rounding per overlapping tap), then the bias in bf16."""
    (n, cin, h, _), (cout, k) = x.shape, w.shape[1:3]
    out = torch.zeros(n, cout, h + k - 1, h + k - 1, dtype=torch.bfloat16)
    for i in range(n):
        cols = (w.float().reshape(cin, -1).T @ x[i].float().reshape(cin, -1)).bfloat16()
        cols = cols.reshape(cout, k, k, h, h)
        for c, kh, kw in itertools.product(range(cout), range(k), range(k)):
            out[i, c, kh : kh + h, kw : kw + h] += cols[c, kh, kw]
    return out + b.reshape(-1, 1, 1)


def test_bf16_conv_transpose_rounds_once_where_the_cpu_rounds_per_tap():
    # docs/device.md: the CPU's bf16 conv_transpose differs from the device by more than bf16
    # tolerance because the CPU rounds every overlapping tap (col2im in bf16); the device, as
    # the TensorE's PSUM, rounds once, and so lands nearer the exact result
    gen = torch.Generator().manual_seed(0)
    x, w, b = (
        torch.randn(*s, generator=gen).bfloat16() for s in ((2, 4, 5, 5), (4, 3, 3, 3), (3,))
    )
    got = F.conv_transpose2d(x.to("neuron"), w.to("neuron"), b.to("neuron")).cpu()
    once = F.conv_transpose2d(x.float(), w.float(), b.float()).bfloat16()
    assert torch.equal(got, once)
    cpu = F.conv_transpose2d(x, w, b)
    if torch.equal(cpu, once):  # a CPU with native bf16: oneDNN rounds once too; its slow
        with torch.backends.mkldnn.flags(enabled=False):  # path is the other CPUs' path
            cpu = F.conv_transpose2d(x, w, b)
    assert torch.equal(cpu, _cpu_bf16_conv_transpose2d(x, w, b))  # the reason, bit for bit
    exact = F.conv_transpose2d(x.double(), w.double(), b.double())
    assert not torch.equal(got, cpu)
    assert (got.double() - exact).abs().sum() < (cpu.double() - exact).abs().sum()


def test_bf16_matmul_gradients_match_cpu_within_bf16_tolerance():
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).bfloat16()
    dev = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(16, 32).bfloat16()
    cpu(x).float().pow(2).sum().backward()
    dev(x.to("neuron")).float().pow(2).sum().backward()
    for p, q in zip(cpu.parameters(), dev.parameters(), strict=True):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=0.05, rtol=0.03)


def test_integer_histc_runs_on_the_device_in_the_input_dtype():
    # transformers' MoE routing calls torch.histc on int expert ids on every device but the CPU
    ids = torch.tensor([0, 3, 1, 1, 3, 3], dtype=torch.int32)
    backend.clear_op_tracking()
    got = torch.histc(ids.to("neuron"), bins=4, min=0, max=3)
    assert got.dtype == torch.int32 and got.device.type == "neuron"
    assert got.cpu().tolist() == [1, 2, 0, 3]
    assert backend.get_fallback_ops() == []
    assert "aten::histc" in backend.get_executed_ops()


@pytest.mark.parametrize(
    "make",
    [lambda: torch.eye(3).to_sparse().to("neuron"),
     lambda: torch.eye(3).to_sparse_csr().to("neuron"),
     lambda: torch.eye(3, device="neuron").to_sparse(),
     lambda: torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.tensor([1.0]), (2, 2),
                                     device="neuron")],
    ids=["coo_to", "csr_to", "to_sparse_on_device", "sparse_coo_tensor"],
)  # fmt: skip
def test_sparse_tensors_are_refused_with_the_area_and_the_workaround(make):
    with pytest.raises(
        NeuronUnsupportedError, match=r"torch\.sparse .*keep the sparse tensor on the CPU"
    ):
        make()


@pytest.mark.parametrize(
    "make",
    [lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]).to("neuron"),
     lambda: torch.nested.nested_tensor([torch.randn(2, device="neuron"),
                                         torch.randn(3, device="neuron")]),
     lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], device="neuron") + 1],
    ids=["nested_to", "nested_of_device_tensors", "op_on_nested_device_tensor"],
)  # fmt: skip
def test_nested_tensors_are_refused_with_the_area_and_the_workaround(make):
    with pytest.raises(
        NeuronUnsupportedError, match=r"torch\.nested .*keep the nested tensor on the CPU"
    ):
        make()


def test_distributions_and_func_transforms_run_on_the_device():
    from torch import distributions as D

    x = torch.rand(3, 4) + 0.5
    xn = x.to("neuron")
    torch.testing.assert_close(D.Normal(xn, xn).log_prob(xn).cpu(), D.Normal(x, x).log_prob(x))
    torch.manual_seed(0)
    want = D.Gamma(x, x).sample()
    torch.manual_seed(0)
    assert torch.equal(D.Gamma(xn, xn).sample().cpu(), want)
    f = lambda a: a.sin().sum()  # noqa: E731
    assert isinstance(torch.func.grad(f)(xn), NeuronTensor)
    torch.testing.assert_close(torch.func.grad(f)(xn).cpu(), torch.func.grad(f)(x))
    torch.testing.assert_close(
        torch.func.vmap(torch.outer)(xn, xn).cpu(), torch.func.vmap(torch.outer)(x, x)
    )
    torch.testing.assert_close(torch.func.hessian(f)(xn[0]).cpu(), torch.func.hessian(f)(x[0]))
    _, tangent = torch.func.jvp(torch.sin, (xn,), (torch.ones_like(xn),))
    torch.testing.assert_close(tangent.cpu(), x.cos())


def test_in_place_restrides_keep_the_wrapper_in_step_while_profiling():
    # nn.GRU(batch_first=True) transposes its output in place; recorded, the wrapper must follow
    t = torch.randn(2, 3, device="neuron")
    gru = nn.GRU(6, 4, batch_first=True).to("neuron")
    with torch.profiler.profile():
        t.transpose_(0, 1)
        out, _h = gru(torch.randn(2, 5, 6, device="neuron"))
    backend.events.clear()
    assert t.shape == t._payload.shape == (3, 2) and t.stride() == t._payload.stride()
    assert out.shape == (2, 5, 4) and out.stride() == out._payload.stride()


def _device_work(dev: str, gn: nn.Module, lin: nn.Module, x0, lp0) -> tuple:
    x = x0.to(dev, copy=True).requires_grad_()
    lp = lp0.to(dev, copy=True).requires_grad_()
    y = gn(x)
    z = F.logsigmoid(y).sum() + F.softplus(y, beta=2).sum() + lin(y).sum()
    hot = torch.zeros(3, 5, device=dev).scatter_(1, torch.tensor([[0], [2], [4]], device=dev), 1.0)
    picked = torch.zeros(3, 5, device=dev).masked_scatter(
        hot.bool(), torch.arange(15.0, device=dev).view(3, 5)
    )
    targets = torch.tensor([[1, 2, 2], [1, 3, 4]], device=dev)
    ctc = F.ctc_loss(lp, targets, (12, 12), (3, 2))
    (z + ctc + (hot + torch.eye(5, device=dev)[:3] + picked).sum()).backward()
    return z.detach().cpu(), ctc.detach().cpu(), x.grad.cpu(), lp.grad.cpu(), picked.cpu()


def test_common_ops_that_are_device_work_on_trainium_run_as_device_kernels(tmp_path):
    # group norm (16-20% of a diffusion UNet step), scatter_, eye, log_sigmoid, softplus's
    # backward, masked_scatter, weight norm and CTC fell back to the host (issue 28)
    import neuron_explorer
    from neuron_explorer.model import Profile

    torch.manual_seed(0)
    gn, lin = nn.GroupNorm(2, 8), nn.Linear(6, 3)
    x0, lp0 = torch.randn(4, 8, 6, 6), torch.randn(12, 2, 5).log_softmax(2)
    want = _device_work("cpu", copy.deepcopy(gn), nn.utils.weight_norm(copy.deepcopy(lin)), x0, lp0)
    on_device = (
        copy.deepcopy(gn).to("neuron"),
        nn.utils.weight_norm(copy.deepcopy(lin).to("neuron")),
    )
    with neuron_explorer.profile(tmp_path / "p", wait=0, warmup=0, active=1) as prof:
        got = _device_work("neuron", *on_device, x0, lp0)
        prof.step()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    db = Profile.open(tmp_path / "p").duckdb()
    assert db.execute("SELECT count(*) FROM events WHERE kind = 'fallback'").fetchone()[0] == 0
    kernels = {
        r[0]
        for r in db.execute("SELECT DISTINCT op_name FROM events WHERE kind = 'kernel'").fetchall()
    }
    assert kernels >= {
        "aten::native_group_norm", "aten::native_group_norm_backward", "aten::scatter_",
        "aten::eye", "aten::log_sigmoid_forward", "aten::log_sigmoid_backward",
        "aten::softplus_backward", "aten::masked_scatter", "aten::_weight_norm_interface",
        "aten::_ctc_loss", "aten::_ctc_loss_backward",
    }  # fmt: skip

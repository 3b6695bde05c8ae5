"""Training on the neuron device gives the same numbers as the same model and seed on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from neuron_explorer import backend  # noqa: F401  (registers the device even with autoload off)


def _train(make_model, make_opt, make_batch, device: str, steps: int = 3, clip: float = 0.0):
    torch.manual_seed(0)
    model = make_model().to(device)
    opt = make_opt(model.parameters())
    losses = []
    for _ in range(steps):
        x, y = (t.to(device) for t in make_batch())
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _assert_same(device_run, cpu_run, exact: bool = True):
    (dl, dp), (cl, cp) = device_run, cpu_run
    if exact:
        assert dl == cl
        assert all(torch.equal(a, b) for a, b in zip(dp, cp, strict=True))
    else:
        assert dl == pytest.approx(cl, rel=1e-5)
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(dp, cp, strict=True))


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _batch():
    return torch.randn(6, 8), torch.randn(6, 4)


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
        lambda p: torch.optim.SGD(p, lr=0.1, fused=True),
        lambda p: torch.optim.Adam(p, lr=1e-2),
        lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
        lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
        lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
        lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    ],
    ids=["sgd", "sgd-foreach", "sgd-fused", "adam", "adam-foreach", "adam-fused",
         "adamw-foreach", "adamw-fused"],
)  # fmt: skip
def test_optimizers_match_cpu(make_opt):
    _assert_same(
        _train(_mlp, make_opt, _batch, "neuron", clip=1.0),
        _train(_mlp, make_opt, _batch, "cpu", clip=1.0),
    )


def test_transformer_encoder_training_matches_cpu():
    def model():
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        return nn.Sequential(nn.TransformerEncoder(layer, 2), nn.Linear(16, 4))

    def batch():
        return torch.randn(2, 5, 16), torch.randn(2, 5, 4)

    adamw = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    _assert_same(_train(model, adamw, batch, "neuron", 2), _train(model, adamw, batch, "cpu", 2))


def test_cnn_with_batchnorm_matches_cpu_and_keeps_buffers_on_device():
    def model():
        return nn.Sequential(
            nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(4 * 3 * 3, 2),
        )  # fmt: skip

    def batch():
        return torch.randn(2, 3, 8, 8), torch.randn(2, 2)

    sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    _assert_same(_train(model, sgd, batch, "neuron", 2), _train(model, sgd, batch, "cpu", 2))
    bn = model().to("neuron")[1]
    assert bn.running_mean.device.type == "neuron"


def test_sdpa_and_checkpoint_gradients_match_cpu():
    torch.manual_seed(0)
    q = torch.randn(2, 2, 5, 8)
    lin = nn.Linear(8, 8)
    grads = {}
    for device in ("cpu", "neuron"):
        qd = q.to(device).detach().requires_grad_()
        layer = nn.Linear(8, 8).to(device)
        layer.load_state_dict(lin.state_dict())
        y = nn.functional.scaled_dot_product_attention(qd, qd, qd, is_causal=True)
        out = checkpoint(layer, y, use_reentrant=False)
        out.pow(2).sum().backward()
        grads[device] = (qd.grad.cpu(), layer.weight.grad.cpu())
    assert torch.allclose(grads["neuron"][0], grads["cpu"][0], atol=1e-6)
    assert torch.allclose(grads["neuron"][1], grads["cpu"][1], atol=1e-6)


def test_autocast_bf16_matches_cpu_autocast():
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 8), torch.randn(4, 8)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        ref = lin(x)
    dev = nn.Linear(8, 8).to("neuron")
    dev.load_state_dict(lin.state_dict())
    with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
        out = dev(x.to("neuron"))
        probs = out.float().softmax(-1)
    assert out.dtype == torch.bfloat16 and probs.dtype == torch.float32
    assert torch.equal(out.cpu(), ref)
    out.float().sum().backward()
    assert dev.weight.grad.dtype == torch.float32

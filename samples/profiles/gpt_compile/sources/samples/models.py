"""Small models and helpers shared by the samples: a GPT-style language model, a CNN, and the
device choice (the `neuron` device, or the CPU with a message when the backend is missing)."""

from __future__ import annotations

import argparse
import math
import sys

import torch
from torch import nn
from torch.nn import functional as F


def sample_args(description: str, steps: int, **extra: int) -> argparse.Namespace:
    """The command line every sample shares: --device, --steps and a few integer knobs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="neuron", help="neuron (default) or cpu")
    parser.add_argument("--steps", type=int, default=steps, help="training steps to run")
    for name, default in extra.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return parser.parse_args()


def pick_device(name: str) -> torch.device:
    """The device asked for; a missing neuron backend falls back to the CPU with a message."""
    if name.split(":")[0] != "neuron":
        return torch.device(name)
    try:
        from neuron_explorer import backend  # noqa: F401 - registers the neuron device when autoload did not

        if torch.neuron.is_available():
            return torch.device(name)
        problem = "torch.neuron.is_available() is False"
    except Exception as exc:  # noqa: BLE001 - any failure means: no device, run on the CPU
        problem = f"{exc.__class__.__name__}: {exc}"
    print(f"neuron device unavailable ({problem}); running on cpu", file=sys.stderr)
    return torch.device("cpu")


class CausalSelfAttention(nn.Module):
    """Multi-head attention with a causal mask, written out op by op (no fused kernel)."""

    def __init__(self, dim: int, heads: int, context: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        causal = torch.ones(context, context, dtype=torch.bool).tril()
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        weights = F.softmax(scores, dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, context: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, context)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        h = F.gelu(self.fc(self.ln2(x)))
        return x + self.out(h)


class TinyGPT(nn.Module):
    """A GPT-style language model: token and position embeddings, causal blocks, a linear head."""

    def __init__(
        self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2, context: int = 64
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, context) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("positions", torch.arange(context), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(self.positions[: idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def token_batch(batch: int, seq: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Random token ids of shape (batch, seq + 1) on the CPU: inputs and shifted targets."""
    return torch.randint(0, vocab, (batch, seq + 1), generator=generator)


class SmallCNN(nn.Module):
    """Two conv blocks with BatchNorm and a linear classifier, for 3x32x32 images."""

    def __init__(self, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(2 * width * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))

"""The model zoo of tests/test_zoo.py and benchmarks/zoo_bench.py: real models from tiny configs.

Transformers models are built from configs (random init, no downloads; `transformers` is a test
requirement, pinned in requirements-dev.txt), plus torch's own nn.LSTM, nn.GRU and a model
whose layers filter in the frequency domain (rfft -> complex weights -> irfft).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

import neuron_explorer.backend as backend

VOCAB = 64


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: how to build it, a batch of `n` examples, and how it is checked."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], dict]  # n -> CPU tensors, the model's keyword inputs (labels too)
    decoder: bool = False  # generate()s and compiles
    atol: float = 0.0  # 0: bitwise equal to the CPU; else the largest parameter difference
    why: str = ""  # why it is not bitwise, when atol > 0
    fallbacks: tuple[str, ...] = ()  # ops it runs as CPU fallbacks (the device has no kernel)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tokens(n: int, seq: int = 8) -> dict:
    ids = torch.randint(3, VOCAB, (n, seq), generator=_gen(n))
    return {"input_ids": ids, "labels": ids.clone()}


def _images(n: int, size: int = 16) -> dict:
    return {
        "pixel_values": torch.randn(n, 3, size, size, generator=_gen(n)),
        "labels": torch.randint(0, 3, (n,), generator=_gen(n + 1)),
    }


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB,
                                      n_positions=32, bos_token_id=1, eos_token_id=2))  # fmt: skip


def _decoder_config(cls, **extra):
    return cls(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
               intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32,
               bos_token_id=1, eos_token_id=2, pad_token_id=0, **extra)  # fmt: skip


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(_decoder_config(LlamaConfig))


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(_decoder_config(MistralConfig, sliding_window=4))


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(_decoder_config(MixtralConfig, num_local_experts=4,
                                              num_experts_per_tok=2))  # fmt: skip


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32,
                                      intermediate_size=64, vocab_size=VOCAB,
                                      max_position_embeddings=32))  # fmt: skip


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(num_layers=2, num_decoder_layers=2, num_heads=2,
                                               d_model=32, d_kv=16, d_ff=64, vocab_size=VOCAB,
                                               decoder_start_token_id=0, pad_token_id=0,
                                               eos_token_id=1))  # fmt: skip


def _vit():
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig(num_hidden_layers=2, num_attention_heads=2,
                                               hidden_size=32, intermediate_size=64,
                                               image_size=16, patch_size=4, num_labels=3))  # fmt: skip


def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(ResNetConfig(embedding_size=8, hidden_sizes=[8, 16],
                                                     depths=[1, 1], num_labels=3))  # fmt: skip


def _convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    return ConvNextForImageClassification(ConvNextConfig(num_stages=2, hidden_sizes=[8, 16],
                                                         depths=[1, 1], num_labels=3))  # fmt: skip


def _whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1))  # fmt: skip


def _audio(n: int) -> dict:
    return {
        "input_features": torch.randn(n, 8, 32, generator=_gen(n)),
        "labels": torch.randint(3, VOCAB, (n, 6), generator=_gen(n + 1)),
    }


class _Output:
    """What the training loop reads of a model's output, as transformers' ModelOutput has it."""

    def __init__(self, logits: torch.Tensor, labels: torch.Tensor | None) -> None:
        self.logits = logits
        self.loss = None if labels is None else nn.functional.mse_loss(logits, labels)


class Recurrent(nn.Module):
    """A two-layer LSTM or GRU over a sequence and a linear head."""

    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = cell(6, 12, num_layers=2, batch_first=True)
        self.head = nn.Linear(12, 3)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> _Output:
        out, _state = self.rnn(inputs)
        return _Output(self.head(out), labels)


class SpectralFilter(nn.Module):
    """Global-filter layers: rfft along the sequence, a learned complex filter, irfft."""

    def __init__(self, seq: int = 16, width: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(4, width)
        freqs = seq // 2 + 1
        self.filters = nn.ParameterList(
            nn.Parameter(torch.randn(freqs, width, dtype=torch.complex64) * 0.1) for _ in range(2)
        )
        self.head = nn.Linear(width, 2)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> _Output:
        x = self.proj(inputs)
        for w in self.filters:
            spectrum = torch.fft.rfft(x, dim=1) * w
            x = x + torch.nn.functional.gelu(torch.fft.irfft(spectrum, n=x.shape[1], dim=1))
        return _Output(self.head(x), labels)


def _sequence(n: int, features: int, out: int, seq: int) -> dict:
    return {
        "inputs": torch.randn(n, seq, features, generator=_gen(n)),
        "labels": torch.randn(n, seq, out, generator=_gen(n + 1)),
    }


_FUSED_CELL = "the fused RNN cell adds its gates in CUDA's order, the CPU's oneDNN LSTM in its own"

ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel("gpt2", _gpt2, _tokens, decoder=True),
        ZooModel("llama", _llama, _tokens, decoder=True),
        ZooModel("mistral", _mistral, _tokens, decoder=True),
        ZooModel("mixtral", _mixtral, _tokens, decoder=True),
        ZooModel("bert", _bert, _tokens),
        ZooModel("t5", _t5, _tokens),
        ZooModel("vit", _vit, _images),
        ZooModel("whisper", _whisper, _audio),
        ZooModel("resnet", _resnet, lambda n: _images(n, 32)),
        ZooModel("convnext", _convnext, lambda n: _images(n, 32)),
        ZooModel(
            "lstm",
            lambda: Recurrent(nn.LSTM),
            lambda n: _sequence(n, 6, 3, 5),
            atol=1e-5,
            why=_FUSED_CELL,
        ),  # fmt: skip
        ZooModel(
            "gru",
            lambda: Recurrent(nn.GRU),
            lambda n: _sequence(n, 6, 3, 5),
            atol=1e-5,
            why=_FUSED_CELL,
        ),  # fmt: skip
        ZooModel(
            "fft",
            SpectralFilter,
            lambda n: _sequence(n, 4, 2, 16),
            fallbacks=("aten::_fft_c2c", "aten::_fft_c2r", "aten::_fft_r2c"),
        ),  # fmt: skip
    )
}


def on(batch: dict, device: str) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


LR = 1e-2


def train(model: ZooModel, device: str, steps: int = 2, n: int = 2, autocast=None,
          grads: bool = False):  # fmt: skip
    """(losses, parameters on the CPU) after `steps` AdamW steps from seed 0, optionally under
    torch.autocast(device, dtype=autocast); with `grads`, the last step's gradients instead."""
    torch.manual_seed(0)
    backend.clear_op_tracking()
    net = model.build().to(device)
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        with torch.autocast(device_type=device, dtype=autocast, enabled=autocast is not None):
            loss = net(**on(model.batch(n), device)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if grads:
        return losses, [p.grad.cpu() for p in net.parameters() if p.grad is not None]
    return losses, [p.detach().cpu() for p in net.parameters()]


def built(model: ZooModel, device: str) -> nn.Module:
    """The model from seed 0, in eval mode, on `device`."""
    torch.manual_seed(0)
    return model.build().eval().to(device)


def inputs(model: ZooModel, n: int = 2) -> dict:
    """The model's inputs without the labels."""
    batch = model.batch(n)
    batch.pop("labels")
    if model.name == "t5" or model.name == "whisper":
        batch["decoder_input_ids"] = torch.randint(3, VOCAB, (n, 4), generator=_gen(7))
    return batch

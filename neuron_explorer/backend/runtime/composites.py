"""Ops the device runs as compositions of its own ops, registered for the neuron tensor.

- **scaled_dot_product_attention** reaches the device as ONE fused attention op
  (`_scaled_dot_product_flash_attention_for_cpu`, lowered as one flash-attention kernel, as
  NKI-lib's) whenever the CPU would run its fused kernel for the same call, and as PyTorch's
  math path otherwise (dropout, masks the fused kernel refuses): the same choice, so the same
  numbers. Without this, torch takes the math path for any device it has no fused kernel for.
- **the fused RNN cells** (`_thnn_fused_lstm_cell`, `_thnn_fused_gru_cell`) that `nn.LSTM`,
  `nn.GRU`, `LSTMCell` and `GRUCell` call on every accelerator but the CPU: torch has only CUDA
  kernels for them. Here they are the cell's elementwise math on device ops, so autograd
  differentiates them and no CPU fallback is needed.

Each is a kernel on AutogradPrivateUse1 (so training records the composite's ops) and a
dispatch special for when autograd is off (`torch.inference_mode`), where the op reaches
`__torch_dispatch__` whole.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes

_aten = torch.ops.aten
_FLASH = torch.nn.attention.SDPBackend.FLASH_ATTENTION.value


def _hints(sizes) -> list[int]:
    # a symbolic size (dynamic shapes) by the value it was traced with: the choice reads only
    # metadata, and guarding on the size would make the graph static again
    return [s if isinstance(s, int) else (s.node.hint or 1) for s in sizes]


def _cpu_twin(t: torch.Tensor) -> torch.Tensor:
    """An empty CPU tensor with `t`'s metadata: what the CPU's kernel choice looks at."""
    twin = torch.empty_strided(_hints(t.shape), _hints(t.stride()), dtype=t.dtype, device="cpu")
    return twin.requires_grad_(t.requires_grad) if t.is_floating_point() else twin


def _cpu_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> int:
    with _disable_current_modes():  # metadata only: nothing here belongs in a traced graph
        q, k, v = (_cpu_twin(t) for t in (q, k, v))
        mask = None if mask is None else _cpu_twin(mask)
        return torch._fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale=scale,
                                       enable_gqa=enable_gqa)  # fmt: skip


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):  # fmt: skip
    """torch's SDPA on neuron tensors, routed as the CPU routes it (attention.cpp)."""
    choice = _cpu_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    mask = attn_mask
    if mask is not None and mask.dtype == torch.bool:  # as convert_boolean_attn_mask
        mask = torch.zeros_like(mask, dtype=query.dtype).masked_fill_(
            mask.logical_not(), float("-inf")
        )
    if choice == _FLASH:
        return _aten._scaled_dot_product_flash_attention_for_cpu.default(
            query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale
        )[0]
    return _aten._scaled_dot_product_attention_math.default(
        query, key, value, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """CUDA's fused LSTM cell: (hy, cy, workspace of the activated gates)."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1).detach()


def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """CUDA's fused GRU cell: (hy, workspace of reset, input, new gates, hidden n-gate, hx)."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    ir, ii, in_ = input_gates.chunk(3, 1)
    hr, hi, hn = hidden_gates.chunk(3, 1)
    reset = (hr + ir).sigmoid()
    update = (hi + ii).sigmoid()
    new = (in_ + hn * reset).tanh()
    hy = (hx - new) * update + new
    return hy, torch.cat([reset, update, new, hn, hx], 1).detach()


COMPOSITES = {
    "scaled_dot_product_attention": scaled_dot_product_attention,
    "_thnn_fused_lstm_cell": fused_lstm_cell,
    "_thnn_fused_gru_cell": fused_gru_cell,
}


def special(info, args, kwargs):
    """The dispatch special for these ops (autograd off): run the composite on the wrappers."""
    return COMPOSITES[info.name.removeprefix("aten::")](*args, **kwargs)


def register(lib: torch.library.Library) -> None:
    """Install the composites on AutogradPrivateUse1 in `lib` (an aten IMPL library)."""
    for name, fn in COMPOSITES.items():
        lib.impl(name, fn, "AutogradPrivateUse1")

"""Transformers' MoE experts under torch.compile on the device, with no opt-in (issue 28).

Compiled with float32 weights, transformers runs the experts through its custom op
`transformers::grouped_mm_fallback` (and its backward), which the device lowers as a grouped
matmul on TensorE (backend/library_kernels.py): the graph compiles whole, its numbers are
eager's, and the experts are TensorE kernels of the NEFF.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from neuron_explorer import backend

transformers = pytest.importorskip("transformers")

TOKENS, TOP_K = 2 * 8, 2


def _mixtral():
    cfg = transformers.MixtralConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=TOP_K,
    )  # fmt: skip
    return transformers.MixtralForCausalLM(cfg), (32, 64)


def _deepseek_v3():
    cfg = transformers.DeepseekV3Config(
        vocab_size=256, hidden_size=32, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=TOP_K, n_group=1, topk_group=1,
        first_k_dense_replace=0, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.DeepseekV3ForCausalLM(cfg), (32, 32)


MODELS = {"mixtral": _mixtral, "deepseek_v3": _deepseek_v3}


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    backend.clear_op_tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    torch._dynamo.reset()


def _train_step(model, run, ids) -> torch.Tensor:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = run(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.slow  # two tiny transformers models, traced forward and backward
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_compiled_moe_train_step_is_eagers_with_the_experts_on_tensore(name):
    torch.manual_seed(0)
    model, (hidden, inner) = MODELS[name]()
    ids = torch.randint(0, 256, (2, 8)).to("neuron")
    eager = copy.deepcopy(model).to("neuron")
    compiled_model = copy.deepcopy(model).to("neuron")
    compiled = torch.compile(compiled_model, backend="neuron")  # no fallback opt-in
    want = _train_step(eager, eager, ids)
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        got = _train_step(compiled_model, compiled, ids)
        torch.neuron.synchronize()
    events = backend.events.drain()
    assert torch.equal(got.cpu(), want.cpu())
    for (pname, p), q in zip(compiled_model.named_parameters(), eager.parameters(), strict=True):
        assert torch.equal(p.detach().cpu(), q.detach().cpu()), pname
    assert backend.get_fallback_ops() == []

    kernels = {e.id: e for e in events if e.kind == "kernel" and "grouped_mm" in e.name}
    experts = sorted((e.name, e.flops) for e in kernels.values())
    rows = TOKENS * TOP_K  # each token's top-k experts: every row goes to one expert
    gate_up, down = 2 * rows * hidden * 2 * inner, 2 * rows * inner * hidden
    assert experts == sorted([
        ("grouped_mm_fallback", gate_up), ("grouped_mm_fallback", down),
        ("grouped_mm_fallback_backward", 2 * gate_up), ("grouped_mm_fallback_backward", 2 * down),
    ])  # fmt: skip
    assert all(e.op_name.startswith("neuron_graph_") for e in kernels.values())  # in a NEFF
    matmuls = [e for e in events if e.parent_id in kernels and e.name == "nc_matmul"]
    assert {e.engine for e in matmuls} == {"TensorE"}
    assert sum(e.flops for e in matmuls) == sum(e.flops for e in kernels.values())

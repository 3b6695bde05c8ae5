"""Shapes-only mode (docs/device.md): data-less payloads record the same device work as real ones,
and what needs values gets a placeholder with one warning per line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import neuron_explorer
from neuron_explorer import backend
from neuron_explorer.backend.runtime import shapes


class TinyBlock(torch.nn.Module):
    def __init__(self, vocab: int = 96, dim: int = 32) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, 4, batch_first=True)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        a, _ = self.attn(self.norm(h), h, h, need_weights=False)
        h = h + a
        h = h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))
        return self.head(h)


def _train_step_kernels(data_less: bool) -> list[tuple]:
    """The kernels of two recorded training steps (forward, backward, AdamW) of TinyBlock."""
    torch.manual_seed(0)
    with shapes.shapes_only(data_less):
        model = TinyBlock().to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 96, (2, 16)).to("neuron")
        targets = torch.randint(0, 96, (2, 16)).to("neuron")
        assert model.up.weight._payload.is_meta is data_less
        backend.events.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            for _ in range(2):
                logits = model(ids)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad()
            torch.neuron.synchronize()
        events = backend.events.drain()
    return [
        (e.op_name, e.shapes, e.dtypes, e.device_dur_ns, e.flops, e.bytes_read, e.bytes_written)
        for e in events
        if e.kind == "kernel"
    ]


def test_a_data_less_training_step_records_the_same_kernels_shapes_and_modeled_times():
    real = _train_step_kernels(False)
    data_less = _train_step_kernels(True)
    assert len(real) > 50  # forward, backward and the optimizer's kernels
    ops = {k[0] for k in real}
    assert {"aten::addmm", "aten::native_layer_norm_backward"} <= ops
    assert {"aten::lerp_", "aten::addcdiv_"} <= ops  # AdamW
    assert data_less == real


def _train_step_memory(data_less: bool) -> dict[str, int]:
    """What held the device memory at the peak of one AdamW training step of TinyBlock."""
    from neuron_explorer.backend.runtime import memory

    torch.manual_seed(0)
    with shapes.shapes_only(data_less):
        model = TinyBlock().to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 96, (4, 16)).to("neuron")
        memory.reset_peak()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            model(ids).sum().backward()
            opt.step()
        backend.events.clear()
        held = memory.held_at_peak()
    del model, opt
    return held


def test_a_data_less_step_holds_the_same_device_memory_as_a_real_one():
    """The peak and its holders (what hbm-capacity reads) do not depend on the mode: a step
    past the chip's HBM is found alike in a normal run and a data-less one."""
    real = _train_step_memory(False)
    assert real["parameters"] > 0 and real["optimizer state"] > 0 and real["peak"] > 0
    assert _train_step_memory(True) == real


def test_item_tolist_and_print_warn_once_per_line_and_the_run_goes_on():
    with shapes.shapes_only():
        x = torch.randn(4, 8, device="neuron")
        assert x._payload.is_meta
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            values = [x.sum().item() for _ in range(3)]  # one line: one warning
            flags = (x > 0).any().item()
            listed = x.tolist()
            text = repr(x)
            if x.max() > 1:  # a comparison that reads a value: the placeholder is zero
                pytest.fail("a data-less comparison must be False")
    assert values == [0.0, 0.0, 0.0] and flags is False
    assert listed == [[0.0] * 8] * 4
    assert "size=(4, 8)" in text and "shapes-only" in text
    mine = [w for w in caught if "shapes-only mode" in str(w.message)]
    assert [w.filename for w in mine] == [__file__] * 5
    assert len({w.lineno for w in mine}) == 5
    assert ".item()" in str(mine[0].message)


def test_data_dependent_shapes_take_the_documented_fill_ratio():
    with shapes.shapes_only():
        x = torch.randn(10, 6, device="neuron")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            masked = x[x > 0]
            nz = torch.nonzero(x)
            uniq = torch.unique(x)
            x[x < 0] = 0.0
    kept = int(60 * shapes.FILL_RATIO + 0.999)
    assert masked.shape == (kept,) and nz.shape == (kept, 2) and uniq.shape == (kept,)
    assert masked.device.type == "neuron" and masked._payload.is_meta
    doc = shapes.manifest()
    assert doc is not None and doc["fill_ratio"] == shapes.FILL_RATIO
    assert {"aten::index", "aten::nonzero", "aten::_unique2"} <= set(doc["assumed_shapes"])


def test_the_capture_manifest_states_the_mode_and_its_assumptions(tmp_path):
    with neuron_explorer.shapes_only():
        model = torch.nn.Linear(16, 16).to("neuron")
        x = torch.randn(8, 16, device="neuron")
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            on_trace_ready=neuron_explorer.trace_handler(str(tmp_path / "p")),
        ):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                y = model(x)
                y[y > 0].sum().item()
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    mode = manifest["extra"]["shapes_only"]
    assert mode["assumed_shapes"]["aten::index"] >= 1 and mode["placeholders"][".item()"] >= 1
    assert "no values" in mode["numerics"]
    from neuron_explorer.analysis.summary import summarize
    from neuron_explorer.model import Profile

    ready = summarize(Profile.open(tmp_path / "p")).readiness
    assert ready.shapes_only == mode and ready.device_memory.peak_bytes >= 2 * 16 * 16 * 4


def test_a_meta_model_moves_with_to_empty_and_trains_data_less():
    with torch.device("meta"):
        model = TinyBlock()
    with shapes.shapes_only():
        model = model.to_empty(device="neuron")
        ids = torch.randint(0, 96, (2, 16), device="neuron")
        model(ids).sum().backward()
    assert model.head.weight.grad is not None and model.head.weight.grad._payload.is_meta
    assert model.head.weight.grad.shape == (96, 32)


def test_a_transformers_model_from_config_runs_forward_and_backward_data_less():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    with shapes.shapes_only(), torch.device("neuron"):
        model = transformers.LlamaForCausalLM(config)
        ids = torch.randint(0, 256, (1, 32))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    assert out.logits.shape == (1, 32, 256) and out.logits._payload.is_meta
    assert model.model.embed_tokens.weight.grad is not None


SHAPES_FSDP_WORKER = Path(__file__).resolve().parent / "ranks" / "shapes_fsdp_worker.py"


@pytest.mark.sweep  # four real ranks of a data-less model: minutes on two cores
def test_a_step_past_the_chips_hbm_is_a_readiness_finding_and_fsdp2_over_four_ranks_fits(
    tmp_path,
):
    """A 6.4-billion-parameter AdamW step in shapes-only mode needs more than trn2's 96 GiB on
    one rank (hbm-capacity names FSDP2 over 2 ranks); sharded with FSDP2 over 4 real torchrun
    ranks it fits, and no rank's profile has the finding."""
    from test_distributed import torchrun

    from neuron_explorer.analysis import get_rule
    from neuron_explorer.analysis.summary import summarize
    from neuron_explorer.model import Profile

    subprocess.run([sys.executable, str(SHAPES_FSDP_WORKER), str(tmp_path / "one")], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    one = Profile.open(tmp_path / "one")
    (finding,) = get_rule("hbm-capacity").evaluate(one)
    m = finding.evidence.metrics
    assert m["peak_bytes"] > m["hbm_bytes"] == 96 * 2**30
    # parameters, gradients and AdamW state of 24 Linear(16384, 16384): 16 bytes a parameter
    params = 24 * (16384 * 16384 + 16384)
    assert m["parameters_bytes"] == m["gradients_bytes"] == 4 * params
    assert m["optimizer_state_bytes"] == 8 * params
    assert finding.category == "readiness" and "FSDP2 over 2 ranks" in finding.title
    torchrun(SHAPES_FSDP_WORKER, 4, str(tmp_path / "four"), "fsdp", timeout=400)
    four = Profile.open(tmp_path / "four")
    assert four.manifest.ranks == (0, 1, 2, 3)
    assert get_rule("hbm-capacity").evaluate(four) == []
    mem = summarize(four).readiness.device_memory
    assert mem is not None and mem.fits and mem.peak_bytes < m["peak_bytes"] / 2
    # the same job modeled from one process (--model-ranks 4): rank 0's memory as the real one's
    env = {**os.environ, "NEURON_EXPLORER_MODEL_RANKS": "4", "RANK": "0", "WORLD_SIZE": "4",
           "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}  # fmt: skip
    subprocess.run([sys.executable, str(SHAPES_FSDP_WORKER), str(tmp_path / "modeled"), "fsdp"],
                   check=True, capture_output=True, timeout=300, env=env)  # fmt: skip
    modeled = Profile.open(tmp_path / "modeled")
    assert modeled.manifest.extra["model_ranks"]["copies"] == [1, 2, 3]
    assert get_rule("hbm-capacity").evaluate(modeled) == []
    held = modeled.manifest.extra["device_memory"]["held_bytes"]
    assert held["parameters"] == 4 * params // 4  # each rank a quarter of the fp32 weights


def test_tied_weights_are_tagged_once_and_held_memory_adds_up():
    """A tied weight (an embedding shared with the output layer) is one parameter met twice
    while modules are named: tagged once, its gradient once; the roles at the peak add up to
    no more than the peak."""
    from neuron_explorer.backend.runtime import memory

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(64, 16)
            self.out = torch.nn.Linear(16, 64, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.emb(ids))

    with shapes.shapes_only():
        model = Tied().to("neuron")
        opt = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, 64, (4, 8), device="neuron")
        memory.reset_peak()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            model(ids).sum().backward()
            opt.step()
        backend.events.clear()
    held = memory.held_at_peak()
    assert held["parameters"] >= 64 * 16 * 4 and held["optimizer state"] >= 2 * 64 * 16 * 4
    assert sum(v for k, v in held.items() if k != "peak") == held["peak"]


def _compiled_step_kernels(data_less: bool) -> list[tuple]:
    torch.manual_seed(0)
    with shapes.shapes_only(data_less):
        layers = (torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
        compiled = torch.compile(torch.nn.Sequential(*layers).to("neuron"), backend="neuron")
        x = torch.randn(16, 64).to("neuron")
        compiled(x).sum().backward()  # compiles
        backend.events.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            compiled(x).sum().backward()
            torch.neuron.synchronize()
        events = backend.events.drain()
    return [(e.name, e.op_name, e.device_dur_ns, e.flops) for e in events if e.kind == "kernel"]


def test_a_compiled_model_launches_the_same_programs_data_less():
    real = _compiled_step_kernels(False)
    assert any(op.startswith("neuron_graph_") for _n, op, _d, _f in real)
    assert _compiled_step_kernels(True) == real


def _mixtral_events(data_less: bool, experts: str = "grouped_mm", seq: int = 16) -> list:
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    torch.manual_seed(0)
    with shapes.shapes_only(data_less), torch.device("neuron"):
        model = transformers.AutoModelForCausalLM.from_config(
            config, experts_implementation=experts
        )
        ids = torch.randint(0, 256, (2, seq))
        backend.events.clear()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the eager experts' `if expert_idx == ...`
                model(input_ids=ids, labels=ids).loss.backward()
            torch.neuron.synchronize()
        events = backend.events.drain()
    return [e for e in events if e.kind == "kernel"]


def _mixtral_kernels(data_less: bool) -> list[tuple]:
    return [(e.op_name, e.shapes, e.dtypes, e.device_dur_ns) for e in _mixtral_events(data_less)]


def test_a_transformers_moe_routes_data_less_with_the_same_kernels():
    """Mixtral's experts (Transformers' grouped matmul, whose Meta kernel wants bf16) run on
    data-less float32 payloads and launch what a normal run launches."""
    real = _mixtral_kernels(False)
    assert "aten::_grouped_mm" in {k[0] for k in real}
    assert _mixtral_kernels(True) == real


def test_eager_moe_routing_by_one_hot_masks_takes_uniform_routing():
    """Mixtral's eager experts pick each expert's tokens with `torch.where(one_hot(...)[e])`: a
    data-less run routes uniformly, every expert its share of tokens * top_k, so the experts'
    matmuls do the work of the real run (the default fill ratio, half of every mask, gave the
    4 experts 2x the tokens), and the manifest says which ops took uniform routing."""
    shapes._uniform.clear()

    def expert_flops(data_less: bool) -> int:
        kernels = _mixtral_events(data_less, "eager", seq=64)
        return sum(e.flops for e in kernels if ".experts" in (e.module or ""))

    real, data_less = expert_flops(False), expert_flops(True)
    assert real > 0 and data_less == pytest.approx(real, rel=0.05)
    doc = shapes.manifest()
    assert doc is not None and doc["uniform_routing"]["aten::nonzero"] >= 2 * 4  # 2 layers


ENV_SCRIPT = """
import torch
model = torch.nn.Linear(32, 8).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    loss = model(torch.randn(16, 32, device="neuron")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("meta", model.weight._payload.is_meta, "loss", loss.item())
"""


def test_the_environment_variable_turns_the_mode_on_for_a_captured_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ENV_SCRIPT)
    env = {**os.environ, "NEURON_EXPLORER_SHAPES_ONLY": "1"}
    r = subprocess.run([sys.executable, "-m", "neuron_explorer", "capture", "-o",
                        str(tmp_path / "p"), "--", "python", str(script)],
                       capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "meta True loss 0.0" in r.stdout
    assert f"{script}:10: UserWarning: neuron: shapes-only mode: .item()" in r.stderr
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["extra"]["shapes_only"]["fill_ratio_source"] == "default"

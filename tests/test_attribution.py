"""Where in the model (issue 12): every kernel keeps its whole Python stack and its nn.Module
path; hotspots by model line and by module. Real captures of tiny Transformers models
(transformers pinned in requirements-dev.txt) on the neuron device, under trace_handler and
under `neuron-explorer capture`, a compiled model, and an imported CPU Kineto trace."""

from __future__ import annotations

import json
import linecache
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_explorer.analysis import hotspots
from neuron_explorer.importers import import_traces
from neuron_explorer.model import Profile

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "neuron_explorer"]
SHARE = 0.9

MODELS = {
    "gpt2": (
        "from transformers import GPT2Config as C, GPT2LMHeadModel as M\n"
        "cfg = C(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32)\n",
        "modeling_gpt2.py", "transformer.h.0.attn",
    ),
    "llama": (
        "from transformers import LlamaConfig as C, LlamaForCausalLM as M\n"
        "cfg = C(hidden_size=32, intermediate_size=64, num_hidden_layers=2,\n"
        "        num_attention_heads=2, num_key_value_heads=2, vocab_size=100,\n"
        "        max_position_embeddings=32)\n",
        "modeling_llama.py", "model.layers.0.self_attn",
    ),
}  # fmt: skip

TRAIN = """
import sys
import torch
{model}
torch.manual_seed(0)
model = M(cfg).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randint(0, 100, (2, 16)).to("neuron")
def step():
    loss = model(x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
{driver}
"""
HANDLER = """
import neuron_explorer
from torch.profiler import ProfilerActivity, profile, schedule
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
             on_trace_ready=neuron_explorer.trace_handler(sys.argv[1])) as prof:
    for _ in range(3):
        step()
        prof.step()
"""
PLAIN = """
for _ in range(4):
    step()
"""


_captured: dict[tuple[str, str], Profile] = {}


def _captured_once(tmp_path_factory, name: str, how: str) -> Profile:
    """One capture per (model, way) for the whole module: each takes seconds."""
    if (name, how) not in _captured:
        _captured[name, how] = _capture(tmp_path_factory.mktemp(f"{name}-{how}"), name, how)
    return _captured[name, how]


def _capture(tmp_path: Path, name: str, how: str) -> Profile:
    model = MODELS[name][0]
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    driver = HANDLER if how == "handler" else PLAIN
    script.write_text(textwrap.dedent(TRAIN).format(model=model, driver=driver))
    out = tmp_path / "profile"
    if how == "handler":
        cmd = [sys.executable, str(script), str(out)]
    else:
        cmd = [*CLI, "capture", "-o", str(out), "--", sys.executable, str(script)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    return Profile.open(out)


def _kernels(p: Profile) -> list[dict]:
    """Each model kernel (one inside a module) with its stack, innermost first."""
    con = p.duckdb()
    rows = con.execute(
        """SELECT e.id, CAST(e.module AS VARCHAR) AS module, CAST(e.op_name AS VARCHAR) AS op,
                  e.args LIKE '%"backward": true%' AS backward,
                  CAST(e.model_file AS VARCHAR) AS model_file, e.model_line,
                  list(struct_pack(file := CAST(s.file AS VARCHAR), line := s.line,
                                   scope := CAST(s.scope AS VARCHAR)) ORDER BY s.depth) AS stack
           FROM events e LEFT JOIN stacks s ON s.stack_id = e.stack_id
           WHERE e.kind = 'kernel' AND e.module IS NOT NULL GROUP BY ALL"""
    ).fetchall()
    names = ("id", "module", "op", "backward", "model_file", "model_line", "stack")
    return [dict(zip(names, r, strict=True)) for r in rows]


def _text(file: str, line: int) -> str:
    return linecache.getline(file, line).strip()


def _check_model_attribution(p: Profile, modeling: str, attn: str) -> None:
    kernels = _kernels(p)
    for backward in (False, True):
        part = [k for k in kernels if k["backward"] == backward]
        assert len(part) > 50, (backward, len(part))
        in_file = [k for k in part if any(f["file"].endswith(modeling) for f in k["stack"])]
        assert len(in_file) >= SHARE * len(part), (backward, len(in_file), len(part))
        # the module's own call site is on the stack: `self.<leaf>(` in its parent's forward
        named = [k for k in part if k["module"] and not k["module"].rsplit(".", 1)[-1].isdigit()]
        called = [
            k for k in named
            if any(f"self.{k['module'].rsplit('.', 1)[-1]}(" in _text(f["file"], f["line"])
                   for f in k["stack"] if f["file"].endswith(modeling) and f["line"])
        ]  # fmt: skip
        assert len(called) >= SHARE * len(named), (backward, len(called), len(named))
    # every stack is the whole stack: the user's script, the library, torch.nn; none of ours
    scopes = {f["scope"] for k in kernels for f in k["stack"]}
    assert {"user", "library", "torch"} <= scopes
    files = {f["file"] for k in kernels for f in k["stack"]}
    assert not [f for f in files if "/neuron_explorer/" in f]
    # the attention matmuls sit under the first block's attention module
    mats = [k for k in kernels if "bmm" in k["op"] or "scaled_dot_product" in k["op"]]
    assert mats and {k["module"] for k in mats} >= {attn}, {k["module"] for k in mats}
    assert all(".attn" in k["module"] or "self_attn" in k["module"] for k in mats)
    # the model line of each kernel is a line of code that is really there
    for k in kernels[:: max(1, len(kernels) // 25)]:
        assert k["model_file"] and _text(k["model_file"], k["model_line"]), k
    # the modeling file is kept in sources/ (a library file), so the source view works anywhere
    modeling_file = next(
        f["file"] for k in kernels for f in k["stack"] if f["file"].endswith(modeling)
    )
    assert p.source_text(modeling_file) == Path(modeling_file).read_text()


@pytest.mark.parametrize(
    ("name", "how"),
    [
        pytest.param("gpt2", "handler", marks=pytest.mark.slow),
        pytest.param("llama", "capture", marks=pytest.mark.sweep),  # ~7 s quiet; gpt2 stays
        # the other two pairings repeat the same paths: whole-sweep cost, not default-run cost
        pytest.param("gpt2", "capture", marks=pytest.mark.sweep),
        pytest.param("llama", "handler", marks=pytest.mark.sweep),
    ],
)
def test_kernels_reach_the_modeling_file_and_their_module(tmp_path_factory, name, how):
    p = _captured_once(tmp_path_factory, name, how)
    _, modeling, attn = MODELS[name]
    _check_model_attribution(p, modeling, attn)
    tree = {m.path: m for m in hotspots.module_tree(p)}
    assert tree[""].total_ns == sum(m.self_ns for m in tree.values())
    assert tree[attn].forward_ns > 0 and tree[attn].backward_ns > 0
    # one call per forward pass, the same for every block and for the model
    assert tree[attn].calls >= 2 and tree[attn].calls == tree[""].calls
    lines = hotspots.line_hotspots(p, "model").to_pylist()
    assert any(r["file"].endswith(modeling) and r["self_ns"] > 0 for r in lines)
    assert all(r["total_ns"] >= r["self_ns"] for r in lines)


COMPILED = """
import sys
import torch
import neuron_explorer
sys.path.insert(0, sys.argv[2])
from models import TinyGPT
torch.manual_seed(0)
model = TinyGPT(layers=2).to("neuron")
compiled = torch.compile(model, backend="neuron", dynamic=False)
x = torch.randint(0, 256, (2, 16)).to("neuron")
with neuron_explorer.profile(sys.argv[1]):
    for _ in range(2):
        compiled(x).sum().backward()
"""


COMPILED_HF = """
import sys
import torch
import neuron_explorer
{model}
torch.manual_seed(0)
model = M(cfg).to("neuron")
compiled = torch.compile(model, backend="neuron", dynamic=False)
x = torch.randint(0, 100, (2, 16)).to("neuron")
with neuron_explorer.profile(sys.argv[1]):
    for _ in range(2):
        compiled(x, labels=x).loss.backward()
"""


@pytest.mark.sweep  # dynamo traces GPT-2 under the profiler: ~10 s quiet (default suite < 15 min)
def test_a_compiled_transformers_gpt2_keeps_model_lines_and_modules(tmp_path):
    # dynamo's fake tensors meet the profiler's recorded path (transformers' KV cache makes a
    # device tensor inside the graph): it compiles, and its kernels reach modeling_gpt2.py
    script = tmp_path / "compiled_hf.py"
    script.write_text(COMPILED_HF.format(model=MODELS["gpt2"][0]))
    out = tmp_path / "p"
    run = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    kernels = [k for k in _kernels(Profile.open(out)) if k["op"].startswith("neuron_graph_")]
    for backward in (False, True):
        part = [k for k in kernels if k["backward"] == backward]
        assert len(part) > 20, (backward, len(part))
        in_file = [k for k in part if any(f["file"].endswith("modeling_gpt2.py")
                                          for f in k["stack"])]  # fmt: skip
        assert len(in_file) >= SHARE * len(part), (backward, len(in_file), len(part))
        # the innermost modeling-file frame is a line of code that is really there
        for k in in_file[:: max(1, len(in_file) // 20)]:
            f = next(f for f in k["stack"] if f["file"].endswith("modeling_gpt2.py"))
            assert _text(f["file"], f["line"]), k
        assert all(k["stack"][-1]["file"] == str(script) for k in part)  # the user's call
        mods = {k["module"] for k in part}
        assert {"transformer.h.0.attn", "transformer.h.1.mlp"} <= {
            m.rsplit(".", 1)[0] if m.endswith(("c_attn", "c_proj", "c_fc")) else m for m in mods
        }, mods


@pytest.mark.sweep  # the samples' TinyGPT: the same paths as the Transformers GPT-2 above
def test_compiled_kernels_keep_their_fx_nodes_stack_and_module(tmp_path):
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    out = tmp_path / "p"
    run = subprocess.run([sys.executable, str(script), str(out), str(ROOT / "samples")],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    p = Profile.open(out)
    kernels = [k for k in _kernels(p) if k["op"].startswith("neuron_graph_")]
    assert len(kernels) > 20
    for backward in (False, True):
        part = [k for k in kernels if k["backward"] == backward]
        assert part, backward
        in_model = [k for k in part if any(f["file"].endswith("models.py") for f in k["stack"])]
        assert len(in_model) >= SHARE * len(part)
    mods = {k["module"] for k in kernels}
    assert {"blocks.0.attn.qkv", "blocks.1.attn", "head"} <= mods, mods
    # every program's kernels end with the launch's user frame (this script's call of the
    # model); a backward program runs on autograd's device thread, where no user frame is
    # live, and takes its forward program's launch site, as eager backward kernels do
    assert all(k["stack"][-1]["file"] == str(script) for k in kernels)


CPU_TRACE = (
    ROOT / "tests" / "data" / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz"
)


def test_an_imported_cpu_trace_with_stacks_and_modules_is_attributed(tmp_path):
    # recorded with with_stack and with_modules on the CPU (tests/data/kineto-cpu-stacks)
    p = Profile.open(import_traces([CPU_TRACE], tmp_path / "p"))
    ops = (
        p.duckdb()
        .execute(
            """SELECT CAST(name AS VARCHAR), CAST(module AS VARCHAR), CAST(model_file AS VARCHAR)
           FROM events WHERE kind = 'op' AND module IS NOT NULL"""
        )
        .fetchall()
    )
    assert len(ops) > 100
    assert sum(1 for _n, _m, f in ops if f) >= SHARE * len(ops)
    bmm = {m for n, m, _f in ops if n == "aten::bmm"}
    assert bmm and all("GPT2Block_" in m and ".GPT2Attention_" in m for m in bmm), bmm
    addmm_files = {f for n, _m, f in ops if n == "aten::addmm"}
    assert addmm_files and all(f.startswith("transformers/") for f in addmm_files)
    tree = {m.path for m in hotspots.module_tree(p)}
    assert "GPT2Model_0.GPT2Block_0.GPT2Attention_0" in tree
    # backward nodes take their forward op's module through the trace's fwdbwd flows
    backward = (
        p.duckdb()
        .execute(
            """SELECT CAST(name AS VARCHAR), CAST(module AS VARCHAR) FROM events WHERE kind = 'op'
           AND regexp_matches(name, '^[A-Za-z]+Backward[0-9]$')"""
        )
        .fetchall()
    )
    assert len(backward) > 50
    assert sum(1 for _n, m in backward if m is not None) >= SHARE * len(backward)
    bmm_back = {m for n, m in backward if n == "BmmBackward0"}
    assert bmm_back and all(m and ".GPT2Attention_" in m for m in bmm_back), bmm_back


USER_BACKEND = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x).relu()
"""


@pytest.mark.slow
def test_a_user_package_named_backend_is_the_users_code(tmp_path, monkeypatch):
    import importlib

    import torch

    import neuron_explorer

    code = tmp_path / "code"
    pkg = code / "backend"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "net.py").write_text(USER_BACKEND)
    monkeypatch.chdir(code)  # the run's working directory: a source root
    monkeypatch.syspath_prepend(str(code))
    for name in ("backend", "backend.net"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    model = importlib.import_module("backend.net").Net().to("neuron")
    out = tmp_path / "p"
    with neuron_explorer.profile(out):
        for _ in range(2):
            model(torch.randn(4, 8, device="neuron")).sum().backward()
    for name in ("backend.net", "backend"):  # the user's package, not to be seen by others
        sys.modules.pop(name, None)
    p = Profile.open(out)
    rows = (
        p.duckdb()
        .execute(
            """SELECT CAST(src_file AS VARCHAR), src_line, CAST(module AS VARCHAR)
           FROM events WHERE kind = 'kernel' AND op_name = 'aten::addmm'"""
        )
        .fetchall()
    )
    net = str((pkg / "net.py").resolve())
    assert rows and all(f == net and m == "fc" for f, _line, m in rows), rows
    assert all("self.fc(x)" in _text(f, line) for f, line, _m in rows)
    scopes = (
        p.duckdb()
        .execute("SELECT DISTINCT CAST(scope AS VARCHAR) FROM stacks WHERE file = ?", [net])
        .fetchall()
    )
    assert scopes == [("user",)]
    assert p.source_text(net) == (pkg / "net.py").read_text()


@pytest.mark.slow
def test_the_cli_prints_modules_lines_and_summary_hotspots(tmp_path_factory):
    p = _captured_once(tmp_path_factory, "gpt2", "handler")
    run = subprocess.run([*CLI, "modules", str(p.path), "--json"], capture_output=True,
                         text=True, timeout=120, check=True)  # fmt: skip
    modules = json.loads(run.stdout)["modules"]
    assert modules[0]["path"] == "" and modules[0]["label"] == "(model)"
    lines = subprocess.run([*CLI, "lines", str(p.path), "--level", "model", "--json"],
                           capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    top = json.loads(lines.stdout)["lines"]
    assert top and top[0]["self_ns"] >= top[-1]["self_ns"]
    summary = subprocess.run([*CLI, "summary", str(p.path), "--json"], capture_output=True,
                             text=True, timeout=120, check=True)  # fmt: skip
    doc = json.loads(summary.stdout)
    assert doc["top_modules"] and doc["top_model_lines"]
    assert doc["top_model_lines"][0]["file"] == top[0]["file"]
    # findings cite the model library's line and the module, not only the script line
    analyze = subprocess.run([*CLI, "analyze", str(p.path), "--json"], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    findings = json.loads(analyze.stdout)["findings"]
    cited = [f for f in findings if f["evidence"]["model_lines"]]
    assert cited, [f["rule"] for f in findings]
    ev = cited[0]["evidence"]
    assert any("transformers/" in h["file"] for h in ev["model_lines"])
    assert any(h["label"].startswith("transformer.") for h in ev["modules"])

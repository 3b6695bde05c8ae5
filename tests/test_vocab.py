"""The vocabulary declared once (neuron_explorer/vocab): it imports nothing heavy, every group of
kinds is declared, the profile writer refuses an undeclared kind, and every importer and capture
on real data writes only declared kinds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from neuron_explorer.model import Profile, ProfileWriter
from neuron_explorer.model.manifest import Manifest
from neuron_explorer.vocab import kinds

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "neuron_explorer"
DATA = ROOT / "tests" / "data"
PURE = tuple(sorted(p.stem for p in (PACKAGE / "vocab").glob("[a-z]*.py")))


def test_the_vocabulary_imports_no_torch_numpy_or_pyarrow():
    code = (
        "import sys, importlib\n"
        f"for m in {PURE!r}: importlib.import_module('neuron_explorer.vocab.' + m)\n"
        "print(sorted(m for m in ('torch', 'numpy', 'pyarrow') if m in sys.modules))"
    )
    assert "kinds" in PURE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_group_of_kinds_is_made_of_declared_kinds():
    groups = {
        name: value
        for name, value in vars(kinds).items()
        if name.endswith("_KINDS") and name not in ("EVENT_KINDS", "RUNTIME_KINDS")
    }
    assert len(groups) >= 10
    runtime_only = set(kinds.RUNTIME_MARKERS)
    for name, group in groups.items():
        assert set(group) - runtime_only <= set(kinds.EVENT_KINDS), name
    assert len(set(kinds.EVENT_KINDS)) == len(kinds.EVENT_KINDS)
    assert kinds.undeclared(["kernel", "bogus", None]) == ["None", "bogus"]


# An event's kind named in our code: SQL `kind = 'x'` / `kind IN ('x', 'y')`, Python
# `e.kind == "x"` / `e.kind in ("x", "y")` on a runtime event, the importer's codes `K["x"]`
# (a local variable or a page named `kind` is something else).
_EVENT = r"\b(?:e|ev|event|self)\.kind"
_KIND_LITERAL = re.compile(
    rf"""\bkind\s+(?:=|<>|!=)\s+'([a-z_0-9]+)'|{_EVENT}\s*(?:==|!=)\s*["']([a-z_0-9]+)["']"""
    r"""|\bK\[["']([a-z_0-9]+)["']\]"""
)
_KIND_IN = re.compile(rf"""\bkind\s+IN\s*\(([^)]*)\)|{_EVENT}\s+in\s+\(([^)]*)\)""")


def test_every_kind_the_code_names_is_declared():
    named: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        found = {a or b or c for a, b, c in _KIND_LITERAL.findall(text)}
        for groups in _KIND_IN.findall(text):
            found |= set(re.findall(r"""["']([a-z_0-9]+)["']""", " ".join(groups)))
        for k in found:
            named.setdefault(k, set()).add(str(path.relative_to(ROOT)))
    assert {"kernel", "op", "collective", "gpu_memcpy"} <= set(named)
    allowed = set(kinds.EVENT_KINDS) | set(kinds.RUNTIME_MARKERS)
    assert {k: v for k, v in named.items() if k not in allowed} == {}


def _events(kind: str, layer: str = "host") -> dict:
    return {
        "id": [1, 2], "rank": [0, 0], "layer": [layer, layer], "kind": ["op", kind],
        "name": ["a", "b"], "track": ["t", "t"], "start_ns": [0, 5], "dur_ns": [10, 1],
    }  # fmt: skip


@pytest.mark.parametrize("how", ["write_events", "write_events_in_order"])
def test_the_writer_refuses_an_undeclared_kind(tmp_path, how):
    out = tmp_path / "p"
    with pytest.raises(ValueError, match=r"undeclared event kinds \['kernal'\]"):
        with ProfileWriter(out) as w:
            data = _events("kernal")
            if how == "write_events":
                w.write_events(data)
            else:
                w.write_events_in_order([pa.table(data)])
            w.commit(Manifest(source="capture", origin_unix_ns=0))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_importer_that_writes_an_undeclared_kind_fails_and_leaves_no_profile(
    tmp_path, monkeypatch
):
    from neuron_explorer.importers import import_traces, kineto

    # an importer bug: its kind table names "op" "operator" (undeclared)
    names = ["operator" if k == "op" else k for k in kinds.EVENT_KINDS]
    monkeypatch.setattr(kineto, "KIND_NAMES", pa.array(names, pa.string()))
    trace = DATA / "kineto-gpu" / "trace_compare_base_base.json.gz"
    with pytest.raises(ValueError, match=r"undeclared event kinds \['operator'\]"):
        import_traces([trace], tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_the_writer_refuses_an_undeclared_layer_and_keeps_a_declared_kind(tmp_path):
    with pytest.raises(ValueError, match="undeclared layers"):
        with ProfileWriter(tmp_path / "bad") as w:
            w.write_events(_events("kernel", layer="gpu"))
    with ProfileWriter(tmp_path / "good") as w:
        w.write_events(_events("kernel", layer="device"))
        w.commit(Manifest(source="capture", origin_unix_ns=0))
    kinds_written = Profile.open(tmp_path / "good").duckdb().sql("SELECT DISTINCT kind FROM events")
    assert sorted(r[0] for r in kinds_written.fetchall()) == ["kernel", "op"]


def _kinds_of(profile_dir: Path) -> set[str]:
    con = Profile.open(profile_dir).duckdb()
    return {r[0] for r in con.sql("SELECT DISTINCT CAST(kind AS VARCHAR) FROM events").fetchall()}


def test_every_imported_real_trace_holds_only_declared_kinds(imported_profiles, tmp_path):
    from neuron_explorer.importers import import_traces

    dirs = dict(imported_profiles)
    for name, trace in (
        ("mtia", DATA / "kineto-mtia" / "mtia_inference_trace_mtia_inference_rank_0.json.gz"),
        ("stacks", DATA / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz"),
    ):
        dirs[name] = import_traces([trace], tmp_path / name)
    seen: set[str] = set()
    for name, d in dirs.items():
        found = _kinds_of(d)
        assert found and found <= set(kinds.EVENT_KINDS), name
        seen |= found
    # the real traces between them hold the GPU kinds and the framework's
    assert {"op", "gpu_kernel", "gpu_memcpy", "runtime", "step", "python"} <= seen


def test_every_committed_sample_capture_holds_only_declared_kinds():
    samples = sorted((ROOT / "samples" / "profiles").iterdir())
    assert len(samples) >= 5
    seen: set[str] = set()
    for d in samples:
        found = _kinds_of(d)
        assert found <= set(kinds.EVENT_KINDS), d.name
        seen |= found
    assert {"kernel", "instruction", "dma", "compile", "collective", "fallback"} <= seen


def test_lanes_sort_kernels_then_engines_then_other_lanes_then_dma_queues():
    from neuron_explorer.vocab.engines import ENGINES, dma_queue, dma_track, lane_order

    tracks = ["DMA q10", "stream 10", "GpSimdE", "DMA", "CC", "DMA q2", "kernels", "stream 7",
              *ENGINES[:3]]  # fmt: skip
    assert sorted(tracks, key=lane_order) == [
        "kernels", "TensorE", "VectorE", "ScalarE", "GpSimdE", "CC", "stream 7", "stream 10",
        "DMA", "DMA q2", "DMA q10",
    ]  # fmt: skip
    assert dma_queue(dma_track(3)) == 3 and dma_queue("DMA") is None and dma_queue("CC") is None


def test_every_engine_the_backend_models_is_a_declared_lane():
    from neuron_explorer.backend.costmodel.spec import SPECS
    from neuron_explorer.backend.runtime.ops import CATEGORIES
    from neuron_explorer.vocab.engines import DMA_ENGINE, ENGINES

    named = {c.engine for c in CATEGORIES}
    for spec in SPECS.values():
        named |= {spec.vector.name, spec.scalar.name, spec.gpsimd.name}
    assert named <= {*ENGINES, DMA_ENGINE} and len(named) >= 4


def test_the_summary_gives_engines_in_lane_order():
    from neuron_explorer.analysis.summary import summarize
    from neuron_explorer.vocab.engines import lane_order

    summary = summarize(Profile.open(ROOT / "samples" / "profiles" / "gpt_train"))
    names = [e.engine for e in summary.engines]
    assert len(names) >= 4 and names == sorted(names, key=lane_order)
    assert names[0] == "TensorE" and names[-1] == "DMA"
    page = (PACKAGE / "web" / "static" / "js" / "summary.js").read_text(encoding="utf-8")
    assert "ENGINE_ORDER" not in page and "GpSimdE" not in page  # it keeps the server's order


def test_a_manifest_reads_its_device_spec_back_by_attribute():
    from dataclasses import FrozenInstanceError, fields

    from neuron_explorer.backend.costmodel.spec import SPECS
    from neuron_explorer.vocab.device_spec import SpecFigures

    for spec in SPECS.values():
        got = SpecFigures.from_dict(spec.to_dict())
        for f in fields(SpecFigures):
            assert getattr(got, f.name) == getattr(spec, f.name), (spec.name, f.name)
        with pytest.raises(FrozenInstanceError):
            spec.tensor_engine_dim = 64  # type: ignore[misc]
    part = SpecFigures.from_dict({"name": "x", "peak_flops": 9e13, "tensor_engine_dim": 128.0})
    assert (part.peak_flops_bf16, part.tensor_engine_dim, part.hbm_bytes_per_s) == (9e13, 128, None)
    assert SpecFigures.from_dict(None) == SpecFigures() and SpecFigures().name is None
    for d in sorted((ROOT / "samples" / "profiles").iterdir()):
        figures = Profile.open(d).manifest.spec
        assert figures.name in SPECS and all(getattr(figures, f.name) for f in fields(figures))


def test_whose_code_a_file_is_is_decided_by_its_path():
    import importlib.util
    import json
    import typing

    import torch
    import torch.profiler.profiler

    # the installed transformers' file, found without importing it (seconds)
    spec = importlib.util.find_spec("transformers")
    assert spec and spec.submodule_search_locations
    modeling_gpt2 = Path(spec.submodule_search_locations[0], "models", "gpt2", "modeling_gpt2.py")
    assert modeling_gpt2.is_file()

    from neuron_explorer.vocab import frames
    from neuron_explorer.vocab.frames import scope_of

    site = "/home/u/.venv/lib/python3.10/site-packages/"
    expected = {
        torch.nn.modules.module.__file__: frames.TORCH,
        torch.profiler.profiler.__file__: frames.PROFILER,
        json.__file__: frames.STDLIB, typing.__file__: frames.STDLIB,
        str(modeling_gpt2): frames.LIBRARY, pytest.__file__: frames.LIBRARY,
        __file__: frames.USER, frames.__file__: frames.OWN,
        # trimmed by torch.profiler to the sys.path entry they lie under
        "torch/nn/modules/module.py": frames.TORCH, "torch/profiler/profiler.py": frames.PROFILER,
        "transformers/models/gpt2/modeling_gpt2.py": frames.LIBRARY,
        "deepspeed/runtime/engine.py": frames.LIBRARY, "dataclasses.py": frames.STDLIB,
        "logging/__init__.py": frames.STDLIB, "neuron_explorer/backend/tensor.py": frames.OWN,
        "backend/model.py": frames.USER, "web/app.py": frames.USER, "train.py": frames.USER,
        # another machine's absolute paths
        site + "transformers/x.py": frames.LIBRARY, site + "torch/nn/x.py": frames.TORCH,
        site + "neuron_explorer/backend/x.py": frames.OWN,
        "/usr/lib/python3.10/json/decoder.py": frames.STDLIB, "/home/u/proj/train.py": frames.USER,
        "<frozen abc>": frames.STDLIB, "<string>": frames.USER, "<eval_with_key>.3": frames.TORCH,
    }  # fmt: skip
    assert {p: scope_of(p) for p in expected} == expected


def test_the_backend_the_importer_and_capture_share_the_one_predicate():
    import torch.nn.modules.module

    from neuron_explorer.backend.runtime import source
    from neuron_explorer.capture import host
    from neuron_explorer.importers import pystacks
    from neuron_explorer.vocab import frames

    names = {v: k for k, v in source.SCOPE_NAMES.items()}
    paths = (torch.nn.modules.module.__file__, __file__, frames.__file__, "dataclasses.py",
             "transformers/models/gpt2/modeling_gpt2.py", "torch/profiler/profiler.py",
             "backend/model.py", "neuron_explorer/capture/host.py")  # fmt: skip
    for p in paths:
        scope = frames.scope_of(p)
        kept = scope not in (frames.OWN, frames.PROFILER)
        assert source.scope_of_file(p) == (names[scope] if kept else source.OWN), p
        assert pystacks.scope_of(p) == (frames.TORCH if scope == frames.PROFILER else scope), p
        assert source.is_user_file(p) == frames.is_user_file(p) == (scope == frames.USER), p
        assert host.is_own_file(p) == (scope == frames.OWN), p


def test_the_interval_algorithms_on_a_small_lane_by_hand():
    import numpy as np

    from neuron_explorer.vocab import intervals as iv

    # one lane: [0,10) holds [2,5) which holds [3,4); [5,5) is an instant inside [0,10); [20,30)
    start, end = np.array([0, 2, 3, 5, 20]), np.array([10, 5, 4, 5, 30])
    lane = np.zeros(5, np.int64)
    assert iv.nest(lane, start, end).tolist() == [-1, 0, 1, 0, -1]
    parents = iv.nest(lane, start, end)
    assert iv.depths(np.arange(5), parents, lane).tolist() == [0, 1, 2, 1, 0]
    outer = np.array([True, False, False, False, True])
    assert iv.nearest(parents, outer).tolist() == [-1, 0, 0, 0, -1]
    assert iv.step_of(np.array([1, 25, 15]), np.array([20, 0]), np.array([30, 10]),
                      np.array([7, 6])).tolist() == [6, 7, -1]  # fmt: skip
    rows, s, e = iv.merge_arrays(lane, start, end)
    assert (s.tolist(), e.tolist()) == ([0, 20], [10, 30])
    windows = (np.zeros(2, np.int64), np.array([0, 5]), np.array([40, 25]))
    assert iv.covered(np.zeros(2, np.int64), s, e, *windows).tolist() == [20, 10]
    win, gs, gd = iv.gaps(np.zeros(2, np.int64), s, e, *windows, 5)
    assert (win.tolist(), gs.tolist(), gd.tolist()) == ([0, 0, 1], [10, 30, 10], [10, 10, 10])


def test_no_module_reads_the_device_spec_by_string_key():
    """Only SpecFigures.from_dict (vocab/device_spec.py) reads the manifest's JSON form."""
    by_key = re.compile(r"""device_spec(?: or \{\}\))?(?:\.get\(|\[)|\bspec\.get\(["']""")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "device_spec.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if by_key.search(line)
    ]
    assert found == []


def test_no_module_spells_out_a_group_of_kinds_the_vocabulary_declares():
    import ast

    groups = {
        frozenset(v): name
        for name, v in vars(kinds).items()
        if name.endswith("_KINDS") and isinstance(v, (tuple, frozenset)) and len(v) > 1
    }
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "vocab":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1:
                values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if len(values) == len(node.elts) and frozenset(values) in groups:
                    found.append(
                        (str(path.relative_to(ROOT)), node.lineno, groups[frozenset(values)])
                    )
    assert found == []


def test_docstrings_cite_the_projects_own_design_document():
    cites = [
        str(p.relative_to(ROOT))
        for p in (*PACKAGE.rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md")
        if "DESIGN.md" in p.read_text(encoding="utf-8")
    ]
    assert cites == [] and (ROOT / "docs" / "architecture.md").is_file()


def test_key_then_descending_is_lexsorts_order_with_ties_and_extremes():
    """The events' order (start, longest first, trace order), by a stable argsort and a
    lexsort of the tied rows only: the same indices as lexsort of both keys, ties or none."""
    import numpy as np

    from neuron_explorer.vocab.intervals import key_then_descending

    rng = np.random.default_rng(7)
    big = np.iinfo(np.int64).max
    cases = [(np.zeros(0, np.int64), np.zeros(0, np.int64)),
             (np.array([5]), np.array([1])),
             (np.array([big, -big, big, 0]), np.array([0, big, big, 0]))]  # fmt: skip
    for n in (2, 3, 10, 1000):
        for spread in (1, n // 2 + 1, 10 * n):
            cases.append((rng.integers(0, spread, n), rng.integers(0, 4, n)))
    for key, second in cases:
        got = key_then_descending(key, second)
        assert got.tolist() == np.lexsort((-second, key)).tolist()

"""`whatif --speedup 'aten::mm=2'` on compiled graphs (analysis/graph_speedup.py): the small
GPT of samples/gpt_compile.py captured with a batch large enough that the device sets the
step, its mm ops sped up inside the fused groups of its NEFFs and the groups re-timed by the
cost model (modeled figures: deterministic)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_explorer.analysis.depgraph import build_graph
from neuron_explorer.analysis.replay import Change
from neuron_explorer.analysis.whatif import speedup_change, whatif
from neuron_explorer.errors import ExplorerError
from neuron_explorer.model.profile import Profile

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONPATH": str(ROOT)}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_explorer", *args], capture_output=True,
                          text=True, timeout=600, env=ENV, cwd=ROOT)  # fmt: skip


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Profile:
    """One recorded step of the compiled GPT (no recompile in it), batch 512: device-bound."""
    path = tmp_path_factory.mktemp("whatif-compiled") / "gpt_compile"
    proc = _cli("capture", "-o", str(path), "--wait", "1", "--warmup", "1", "--active", "1",
                "--", "python", "samples/gpt_compile.py", "--steps", "3", "--switch-at", "9",
                "--batch", "512")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Profile.open(path)


def _holding_mm(profile: Profile) -> list:
    """The step's compiled kernels that run an aten::mm, by their names (a fused group is
    named fused_ and its ops' names)."""
    graph = build_graph(profile)
    return [n for n in graph.nodes if not n.host and n.neff is not None
            and "mm" in n.name.removeprefix("fused_").split("_")]  # fmt: skip


def test_an_op_inside_fused_kernels_is_sped_up_there_and_the_step_moves(compiled):
    held = _holding_mm(compiled)
    assert any(n.name != "mm" for n in held) and any(n.name == "mm" for n in held)
    w = whatif(compiled, ["aten::mm=2"])
    assert w.fused_kernels == len(held)
    (what,) = w.changes
    assert what.startswith(f"aten::mm 2x faster inside {len(held)} fused kernels of 2 compiled")
    # the same kernels made twice as fast whole: an op that is part of them saves about as much
    # (a lone mm's group is all mm; a fused one keeps its other ops' time)
    whole = whatif(compiled, [f"kernel={k}:2" for k in sorted({n.name for n in held})])
    assert 0 < w.saving_ns and 0.5 * whole.saving_ns < w.saving_ns < 1.05 * whole.saving_ns
    graph = build_graph(compiled)
    change, inside = speedup_change(graph, compiled, ("name", "aten::mm", 2.0), Change(), None)
    assert inside is not None and set(change.durations) == set(inside.durations)
    by_id = {n.event_id: n for n in graph.nodes}
    dropped = sum(by_id[e].dur_ns - d for e, d in change.durations.items())
    assert 0 < w.saving_ns <= dropped  # never more than the device time it takes out
    for n in held:  # each kernel holding mm: faster (a group's span can lose a wait for its
        # inputs too, where the groups before it finish sooner: a little more than 2x)
        assert n.dur_ns / 3 < change.durations[n.event_id] < n.dur_ns
    share = sum(change.durations[n.event_id] for n in held) / sum(n.dur_ns for n in held)
    assert 0.45 < share < 0.75  # about half: mostly mm, the lone ones and the fused one
    same = whatif(compiled, ["aten::mm=1"])  # lowered again unchanged: nothing moves
    assert same.events_changed == 0 and same.saving_ns == 0 and same.fused_kernels == len(held)


def test_op_and_base_names_and_eager_kernels_of_a_compiled_step(compiled):
    w = whatif(compiled, ["aten::mm=2"])
    assert whatif(compiled, ["op=aten::mm:2"]).after_ns == w.after_ns
    assert whatif(compiled, ["mm=2"]).after_ns == w.after_ns  # the op's base name, as eager
    # the optimizer's eager kernels are matched as before, beside the compiled ones
    both = whatif(compiled, ["aten::mm=2", "aten::_foreach_sqrt=2"])
    assert both.events_changed == w.events_changed + 1 and both.after_ns < w.after_ns
    on_trn3 = whatif(compiled, ["aten::mm=2"], chip="trn3")  # groups re-timed on the new chip
    assert on_trn3.after_ns < whatif(compiled, chip="trn3").after_ns
    kernels = sum(1 for n in build_graph(compiled).nodes if not n.host and n.neff is not None)
    with pytest.raises(ExplorerError, match=f"nor an op inside its {kernels} compiled-graph"):
        whatif(compiled, ["aten::conv=2"])


def test_without_its_graphs_a_profile_says_what_to_name_instead(compiled, tmp_path):
    old = tmp_path / "before"
    shutil.copytree(compiled.path, old)
    (old / "graphs.parquet").unlink()
    kernels = sum(1 for n in build_graph(compiled).nodes if not n.host and n.neff is not None)
    with pytest.raises(ExplorerError, match=f"{kernels} of its {kernels} compiled-graph kernels "
                       "have no graph kept"):  # fmt: skip
        whatif(Profile.open(old), ["aten::mm=2"])
    assert whatif(Profile.open(old), ["module=blocks:2"]).events_changed > 0


def test_cli_says_how_many_fused_kernels_the_speedup_reached(compiled):
    held = len(_holding_mm(compiled))
    proc = _cli("whatif", str(compiled.path), "--speedup", "aten::mm=2")
    assert proc.returncode == 0, proc.stderr
    assert f"inside {held} fused kernels" in " ".join(proc.stdout.split())
    doc = json.loads(_cli("whatif", str(compiled.path), "--speedup", "aten::mm=2", "--json").stdout)
    assert doc["fused_kernels"] == held and doc["saving_ns"] > 0


def test_a_speedup_of_a_step_without_compiled_graphs_does_not_load_the_backend():
    """The backend imports torch (3 s and 180 MB of a server's memory on the 10 GB trace's
    what-if, where that import was most of its time): a step without compiled graphs has no
    kernel to lower, so a speedup by name answers without it, the same answer."""
    prof = ROOT / "samples" / "profiles" / "gpt_train"  # eager: no compiled graph
    code = (
        "import sys, json\n"
        "from neuron_explorer.analysis.whatif import whatif\n"
        "from neuron_explorer.model.profile import Profile\n"
        "r = whatif(Profile.open(sys.argv[1]), ['mm=2'], False, None, None, None, 0)\n"
        "print(json.dumps([r.to_dict(), 'torch' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(prof)], capture_output=True,
                         text=True, env=ENV, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-500:]
    doc, torch_loaded = json.loads(out.stdout)
    want = whatif(Profile.open(prof), ["mm=2"], False, None, None, None, 0).to_dict()
    assert doc == json.loads(json.dumps(want)) and "mm 2x faster" in json.dumps(doc)
    assert not torch_loaded

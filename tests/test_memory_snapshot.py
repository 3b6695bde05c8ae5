"""Memory snapshots as torch has them (issue 28): a real model's training step on the device with
the history recorded, the dumped pickle read by torch's own torch.cuda._memory_viz, imported
with the CLI into a profile whose Memory page shows the peak with the allocations alive at it;
a hostile pickle is refused with one line."""

from __future__ import annotations

import base64
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import uvicorn_server
from torch.cuda import _memory_viz

import neuron_explorer.backend  # noqa: F401 - registers the device
from neuron_explorer.model import Profile

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "neuron_explorer"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)
        self.norm = torch.nn.LayerNorm(64)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                       torch.nn.Linear(256, 64))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.mlp(self.norm(x))  # MLP_LINE


MLP_LINE = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                if t.endswith("# MLP_LINE"))  # fmt: skip


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One recorded training step: (snapshot, its pickle, figures read from torch.neuron)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block(), torch.nn.Linear(64, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16, 64, device="neuron")
    y = torch.randint(0, 10, (8, 16), device="neuron")
    torch.neuron.memory._record_memory_history(max_entries=1_000_000)
    try:
        torch.neuron.reset_peak_memory_stats()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        path = tmp_path_factory.mktemp("snapshot") / "snapshot.pickle"
        torch.neuron.memory._dump_snapshot(str(path))
        figures = {"allocated": torch.neuron.memory_allocated(),
                   "peak": torch.neuron.max_memory_allocated()}  # fmt: skip
    finally:
        torch.neuron.memory._record_memory_history(enabled=None)
    with path.open("rb") as f:
        snapshot = pickle.load(f)
    return snapshot, path, figures


@pytest.mark.slow
def test_torchs_memory_viz_reads_the_devices_snapshot(recorded):
    snapshot, _path, figures = recorded
    # segsum checks that every segment's blocks add up; its total is the device's accounting
    summary = _memory_viz.segsum(snapshot)
    blocks = [b for s in snapshot["segments"] for b in s["blocks"]]
    assert sum(b["size"] for b in blocks) == figures["allocated"]
    assert f"total_allocated: {_memory_viz.Bytes(figures['allocated'])}" in summary
    trace = snapshot["device_traces"][0]
    actions = [e["action"] for e in trace]
    assert actions.count("alloc") > 50 and actions.count("free_completed") > 20
    text = _memory_viz.trace(snapshot)
    assert text.count(" = MEM[") + text.count(" = seg_") + text.count("cudaMalloc") > 0
    # the flamegraph of what is live (AdamW's state, made in its step) and the stacks of the
    # history: the user's line, and torch's module frames inside it
    lines = _memory_viz.memory(snapshot, format_flamegraph=lambda t: t).splitlines()
    assert any("adam.py" in ln for ln in lines)
    here = Path(__file__).name
    stacks = [
        ";".join(_memory_viz._frames_fmt(e["frames"])) for e in trace if e["action"] == "alloc"
    ]
    assert any(f"{here}:{MLP_LINE}:forward" in s and "linear.py" in s for s in stacks)
    # backward's allocations: the autograd node, then the forward op's stack
    grads = [e for e in trace if e["action"] == "alloc" and e["frames"]
             and e["frames"][0]["filename"] == "<autograd>"]  # fmt: skip
    assert grads and any(e["frames"][1:] and e["module"] for e in grads)
    # the HTML plots embed the snapshot itself (pytorch.org/memory_viz's reader)
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        encoded = json.loads(re.search(r"const local_files = (\[.*\])", html).group(1))
        again = pickle.loads(base64.b64decode(encoded[0]["base64"]).rstrip(b"\x00"))
        assert len(again["device_traces"][0]) == len(trace)
    kept = _memory_viz.filter_alloc_free_pairs(pickle.loads(pickle.dumps(snapshot)))
    assert sum(e["action"] == "alloc" for e in kept["device_traces"][0]) < actions.count("alloc")


@pytest.fixture(scope="module")
def imported(recorded, tmp_path_factory):
    _snapshot, path, _figures = recorded
    out = tmp_path_factory.mktemp("root") / "snap"
    r = subprocess.run([*CLI, "import", str(path), "-o", str(out), "--source-root",
                        str(Path(__file__).parent)], capture_output=True, text=True, env=ENV,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.slow
def test_the_imported_snapshot_shows_the_peak_and_what_was_alive_there(recorded, imported):
    from neuron_explorer.analysis.memory import memory_page

    _snapshot, _path, figures = recorded
    profile = Profile.open(imported)
    assert profile.manifest.source == "memory_snapshot"
    page = memory_page(profile, profile.duckdb()).to_dict()
    assert page["peak"]["value"] == figures["peak"] and page["peak"]["track"] == "neuron:0"
    final = [c for c in page["counters"] if c["name"] == "memory_allocated"][0]["last"][-1]
    assert final == figures["allocated"]
    alive = page["alive"]
    assert alive["bytes"] == figures["peak"]  # the allocations alive at the peak are the peak
    assert alive["count"] >= len(alive["largest"]) > 0
    here = str(Path(__file__))
    mlp = [r for r in alive["by_line"] if r["file"] == here and r["line"] == MLP_LINE]
    assert mlp and mlp[0]["bytes"] > 0
    modules = {r["module"] for r in alive["by_module"]}
    assert {"0.mlp.0", "1.mlp.0"} & modules, modules
    # the line's file is kept, for the source view (under --source-root)
    assert [p.name for p in (imported / "sources").rglob(Path(__file__).name)]
    # the parameters were allocated before the history began: alive, with no line
    assert any(r["before_history"] and r["file"] is None for r in alive["largest"])


@pytest.mark.slow
@pytest.mark.browser
def test_the_memory_page_of_a_snapshot_lists_what_was_alive_and_charges_no_ops(
    imported, profiler_made, tmp_path
):
    """The device's own snapshot and torch.profiler's, served by a real uvicorn to Chromium at
    1600x1000: the peak's cards, the allocations alive at it with their lines, and none of the
    tables of a counter's rises charged to ops (a snapshot has no ops: they were empty).
    Screenshots: screenshots/ui-memory-snapshot-*.png."""
    browser_test = pytest.importorskip("playwright.sync_api")
    chromium = "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("Debian's chromium is not installed (make browser)")
    from neuron_explorer.web.app import create_app

    root = tmp_path / "root"
    shutil.copytree(imported, root / "snap")
    shutil.copytree(profiler_made[0], root / "cpu")
    shots = ROOT / "screenshots"
    shots.mkdir(exist_ok=True)
    app = create_app(root, analysis_cache=tmp_path / "cache")
    seen: dict[str, dict[str, str]] = {}
    errors: list[str] = []
    with uvicorn_server(app) as url, browser_test.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"])
        page = b.new_page(viewport={"width": 1600, "height": 1000})
        page.on("pageerror", lambda e: errors.append(str(e)))
        for name in ("snap", "cpu"):
            page.goto(f"{url}/p/{name}/memory")
            page.wait_for_selector("#memory-alive table tbody tr", timeout=60_000)
            page.wait_for_selector("#memory-chart .main-svg")
            page.screenshot(path=str(shots / f"ui-memory-snapshot-{name}.png"), full_page=True)
            seen[name] = {k: page.inner_text(sel) for k, sel in (
                ("cards", "#memory-peak"), ("alive", "#memory-alive"),
                ("sums", "#memory-alive-sums"), ("body", "body"))}  # fmt: skip
            seen[name]["links"] = str(page.locator("#memory-alive-sums a.mem-line").count())
        b.close()
    assert errors == []
    snap, cpu = seen["snap"], seen["cpu"]
    for one in (snap, cpu):
        assert (
            "Allocations alive" in one["cards"] and "Allocated before the history" in one["cards"]
        )
        assert "by op" not in one["body"] and "charged to ops" not in one["body"]
        assert "before the history" in one["alive"] and int(one["links"]) >= 1
    assert "neuron:0" in snap["cards"] and "0.mlp.0" in snap["sums"]
    assert f"{Path(__file__).name}:{MLP_LINE}" in snap["sums"]
    assert "At entry" in cpu["cards"] and "\ncpu" in cpu["cards"]  # no times; the host's
    assert f"{Path(__file__).name}:{PROFILED_LINE}" in cpu["sums"]
    assert "no module paths" in cpu["sums"]


class _Hostile:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (_Hostile(), "refused: not a memory snapshot: it names posix.system"),
        (
            {"segments": [{"blocks": [{"size": "big"}]}]},
            "segments[0].blocks[0] has no integer 'size'",
        ),
        ({"device_traces": [[{"action": "alloc", "addr": 1}]]}, "has no integer 'size'"),
        (b"not a pickle at all", "not a memory snapshot (a broken pickle"),
    ],
)
def test_a_bad_snapshot_is_one_line_naming_it(tmp_path, data, says):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(data[2:] if isinstance(data, bytes) else pickle.dumps(data))
    r = subprocess.run([*CLI, "import", str(path), "-o", str(tmp_path / "out")], cwd=tmp_path,
                       capture_output=True, text=True, env=ENV, timeout=120)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and str(path) in r.stderr and says in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


def test_torch_neuron_has_torch_cudas_memory_names():
    names = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
             "memory_stats", "memory_summary", "memory_snapshot", "reset_peak_memory_stats",
             "reset_max_memory_allocated", "reset_accumulated_memory_stats", "empty_cache",
             "mem_get_info")  # fmt: skip
    for name in names:
        assert callable(getattr(torch.neuron, name)) and callable(getattr(torch.cuda, name))
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot"):
        assert callable(getattr(torch.neuron.memory, name))
    from neuron_explorer.backend.runtime import model

    x = torch.ones(1000, device="neuron")
    free, total = torch.neuron.mem_get_info()
    assert total == model.spec().hbm_bytes and free == total - torch.neuron.memory_allocated()
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()
    assert torch.accelerator.get_memory_info() == (free, total)
    torch.neuron.empty_cache()
    torch.accelerator.empty_cache()
    torch.accelerator.empty_host_cache()  # no host allocator was registered: it crashed
    assert torch.neuron.memory_allocated() >= x.numel() * 4


@pytest.fixture(scope="module")
def profiler_made(tmp_path_factory):
    """torch's own snapshot producer (_memory_viz._profile_to_snapshot of a CPU run profiled
    with profile_memory=True: a caching segment with inactive gaps, tensors that existed before
    the profile, frames named "file.py(LINE): func", no times), imported with the CLI: (the
    profile, the peak and the final bytes of the profiler's own memory timeline)."""
    from torch.profiler._memory_profiler import Action, TensorKey

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # the profiler names a frame that was running when it started at the line it was at then
    with torch.profiler.profile(  # PROFILED_LINE
        profile_memory=True, record_shapes=True, with_stack=True, with_modules=True
    ) as prof:
        model(torch.randn(32, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
    snapshot = _memory_viz._profile_to_snapshot(prof)
    assert any(b["state"] == "inactive" for s in snapshot["segments"] for b in s["blocks"])
    total = peak = 0
    for _t, action, (key, _version), size in prof._memory_profile().timeline:
        if isinstance(key, TensorKey):
            total += size if action in (Action.CREATE, Action.PREEXISTING) else 0
            total -= size if action == Action.DESTROY else 0
            peak = max(peak, total)
    tmp = tmp_path_factory.mktemp("profiler-made")
    path = tmp / "cpu.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    out = tmp / "root" / "cpu"
    r = subprocess.run([*CLI, "import", str(path), "-o", str(out), "--source-root",
                        str(Path(__file__).parent)], capture_output=True, text=True, env=ENV,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out, peak, total


PROFILED_LINE = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                     if t.endswith("# PROFILED_LINE"))  # fmt: skip


def test_a_snapshot_torch_made_imports_with_torchs_own_peak_on_the_host(profiler_made):
    from neuron_explorer.analysis.memory import memory_page

    out, peak, total = profiler_made
    profile = Profile.open(out)
    page = memory_page(profile, profile.duckdb()).to_dict()
    assert page["peak"]["value"] == peak > 0 and page["alive"]["bytes"] == peak
    assert page["counters"][0]["last"][-1] == total
    # its tensors are the host's (the profiler's to_device puts every non-CUDA one last), not
    # cuda:0's; its frames name their lines in the frame's name
    assert page["peak"]["track"] == "cpu" and page["alive"]["timed"] is False
    assert profile.manifest.extra["memory_snapshot"]["made_by"] == "profiler"
    here = [r for r in page["alive"]["by_line"] if r["file"].endswith(Path(__file__).name)]
    assert here and here[0]["line"] == PROFILED_LINE
    # no ops to charge: the peak is where and when, what was alive is the allocations
    assert "by_op" not in page["peak"]
    # recorded with_modules=True: each forward allocation's module, as a trace's are named
    # (the outermost module the root, ""); the backward's run with no Python stack (issue 28)
    modules = profile.duckdb().execute("SELECT DISTINCT module FROM events").fetchall()
    assert {("Linear_0",), ("Linear_1",)} <= set(modules)


def test_an_allocator_snapshot_without_a_device_type_is_cudas(recorded, tmp_path):
    from neuron_explorer.analysis.memory import memory_page

    snapshot, _path, figures = recorded
    plain = {k: v for k, v in snapshot.items() if k != "device_type"}  # as torch.cuda's has it
    path = tmp_path / "cuda.pickle"
    path.write_bytes(pickle.dumps(plain))
    out = tmp_path / "p"
    r = subprocess.run([*CLI, "import", str(path), "-o", str(out)], capture_output=True,
                       text=True, env=ENV, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    profile = Profile.open(out)
    page = memory_page(profile, profile.duckdb()).to_dict()
    assert page["peak"]["track"] == "cuda:0" and page["peak"]["value"] == figures["peak"]
    about = profile.manifest.extra["memory_snapshot"]
    assert about["made_by"] == "allocator" and about["devices"] == ["cuda:0"] and about["timed"]


def test_serve_takes_a_snapshot_pickle_as_it_takes_a_trace(recorded, tmp_path, monkeypatch):
    from neuron_explorer.model.profile import is_profile
    from neuron_explorer.web import resolve_root

    _snapshot, path, _figures = recorded
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    served = resolve_root(path)
    assert served.name == "snapshot" and is_profile(served)
    assert Profile.open(served).manifest.source == "memory_snapshot"


def test_torch_accelerators_snapshot_still_goes_to_torch_cuda():
    # torch 2.13's torch.accelerator.memory._snapshot sends every accelerator but XPU to
    # torch.cuda with no hook for another (docs/device.md): when torch adds one, use it there
    import inspect

    source = inspect.getsource(torch.accelerator.memory._snapshot)
    assert 'acc.type == "xpu"' in source and "return torch.cuda.memory._snapshot(" in source
    assert torch.accelerator.current_accelerator().type == "neuron"
    with pytest.raises(AttributeError, match="_cuda_memorySnapshot"):
        torch.accelerator.memory._snapshot()
    assert isinstance(torch.neuron.memory._snapshot(), dict)  # the device's own


def test_state_only_recording_keeps_stacks_of_live_blocks_and_no_history():
    from neuron_explorer.backend.runtime import memory

    torch.neuron.memory._record_memory_history(enabled="state", clear_history=True)
    try:
        kept = torch.ones(1000, device="neuron") * 2  # KEPT_LINE
        (torch.ones(500, device="neuron") + 1).sum()
        snapshot = torch.neuron.memory._snapshot()
    finally:
        torch.neuron.memory._record_memory_history(enabled=None)
    assert memory.ON_ALLOC is None and memory.ON_FREE is None  # off: nothing on the op path
    assert snapshot["device_traces"] == [[]]
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                if t.endswith("# KEPT_LINE"))  # fmt: skip
    blocks = [b for s in snapshot["segments"] for b in s["blocks"] if b["size"] == 4000]
    assert any(b["frames"] and b["frames"][0]["line"] == line for b in blocks)
    del kept
    with pytest.raises(ValueError, match="enabled must be one of"):
        torch.neuron.memory._record_memory_history(enabled="sometimes")

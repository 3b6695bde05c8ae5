"""A hostile trace cannot copy local files into a profile (issue 17): its frame names choose
the files, so only Python sources under the trace's own folder or the given --source-roots are
kept, never a path out of them, and the profile says which files it skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from neuron_explorer.capture.sources import MAX_SOURCE_BYTES, readable, select
from neuron_explorer.importers import import_traces
from neuron_explorer.model import Profile

CLI = [sys.executable, "-m", "neuron_explorer"]


def _trace(path: Path, frames: list[str]) -> Path:
    """A small Kineto trace: one step, one python frame per name (nested), one op inside."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
               "tid": 1, "ts": 1000, "dur": 900, "args": {}}]  # fmt: skip
    for i, name in enumerate(frames):
        events.append({"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1,
                       "ts": 1001 + i, "dur": 800 - 2 * i,
                       "args": {"Python id": i + 1, "Python parent id": i}})  # fmt: skip
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                   "ts": 1100, "dur": 100, "args": {}})  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 10**18}))
    return path


def test_a_hostile_trace_copies_only_python_sources_under_its_roots(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY\n")
    (home / "settings.py").write_text("TOKEN = 'secret'\n")  # a Python file, but outside
    project = home / "project"
    (project / "traces").mkdir(parents=True)
    (project / "train.py").write_text("def main():\n    return 1\n")
    (project / "notes.txt").write_text("not code\n")
    os.symlink(home / "settings.py", project / "link.py")  # inside by name, outside for real
    frames = [
        "train.py(2): main",  # relative: beside the traces/ folder, kept once it is a root
        f"{home / '.ssh' / 'id_rsa'}(1): f",  # absolute, outside, not Python
        f"{home / 'settings.py'}(1): f",  # absolute, outside
        "../settings.py(1): g",  # climbs out of a root
        "../../settings.py(1): g",
        "link.py(1): h",  # a symlink out
        f"{project / 'notes.txt'}(1): k",  # inside, not a Python source
        "/etc/hostname(1): f",
    ]
    trace = _trace(project / "traces" / "run.pt.trace.json", frames)
    # only the trace's own folder: not the project above it (issue 29: a trace saved in
    # ~/Downloads would expose every Python file of the home folder)
    alone = import_traces([trace], tmp_path / "alone")
    assert not (alone / "sources").exists()
    assert {s["file"]: s["reason"] for s in Profile.open(alone).manifest.extra["sources_skipped"]}[
        "train.py"
    ] == "not found"
    out = tmp_path / "profile"
    run = subprocess.run([*CLI, "import", str(trace), "-o", str(out), "--source-root", str(project)],
                         capture_output=True, text=True, timeout=120, cwd=home)  # fmt: skip
    assert run.returncode == 0, run.stderr
    p = Profile.open(out)
    kept = sorted(str(f.relative_to(out / "sources")) for f in (out / "sources").rglob("*")
                  if f.is_file())  # fmt: skip
    assert kept == ["train.py"]
    assert p.source_text("train.py") == (project / "train.py").read_text()
    for name in ("settings.py", "../settings.py", str(home / ".ssh" / "id_rsa"), "link.py"):
        assert p.source_text(name) is None
    skipped = {s["file"]: s["reason"] for s in p.manifest.extra["sources_skipped"]}
    assert skipped[str(home / ".ssh" / "id_rsa")] == "not a Python source"
    assert skipped[str(home / "settings.py")] == "outside the source roots"
    assert skipped["../../settings.py"] == "outside the source roots"
    assert skipped["link.py"] == "outside the source roots"
    assert skipped[str(project / "notes.txt")] == "not a Python source"
    assert p.manifest.extra["sources_skipped_count"] == len(skipped)
    # the same trace with the home directory as a --source-root: settings.py is then allowed
    again = import_traces([trace], tmp_path / "p2", source_roots=[home])
    assert Profile.open(again).source_text(str(home / "settings.py")) == "TOKEN = 'secret'\n"


def test_only_small_utf8_python_files_under_a_root_are_kept(tmp_path):
    root, outside = tmp_path / "project", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "train.py").write_text("print('hi')\n")
    (root / "big.py").write_text("#" * (MAX_SOURCE_BYTES + 1))
    (root / "binary.py").write_bytes(b"\xff\xfe\x00")
    (outside / "secret.py").write_text("token = 1\n")
    os.symlink(outside / "secret.py", root / "link.py")
    names = [str(root / n) for n in ("train.py", "big.py", "binary.py", "link.py", "gone.py")]
    names.append(str(outside / "secret.py"))
    assert dict(readable(names, [str(root)])) == {str(root / "train.py"): "print('hi')\n"}
    why = dict(select(names, [root]).skipped)
    assert why == {
        str(root / "big.py"): "too large", str(root / "binary.py"): "unreadable",
        str(root / "link.py"): "outside the source roots", str(root / "gone.py"): "not found",
        str(outside / "secret.py"): "outside the source roots",
    }  # fmt: skip


def test_relativize_names_files_relative_to_the_repository(tmp_path, monkeypatch):
    """samples/make_profiles.py runs relativize on each capture (issue 12): no path of the
    capturing machine stays in the tables, the kept sources or the manifest."""
    import importlib.util

    import torch

    import neuron_explorer
    from neuron_explorer.capture.relocate import relativize

    repo = tmp_path / "repo"
    (repo / "samples").mkdir(parents=True)
    model_py = repo / "samples" / "tiny.py"
    model_py.write_text("def run(layer, x):\n    return layer(x).relu().sum()\n")
    spec = importlib.util.spec_from_file_location("tiny_sample", model_py)
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    monkeypatch.chdir(repo)  # a source root of the capture
    layer = torch.nn.Linear(8, 4).to("neuron")
    out = tmp_path / "profile"
    with neuron_explorer.profile(out):
        tiny.run(layer, torch.randn(2, 8, device="neuron")).backward()
    before = Profile.open(out).source_text(str(model_py.resolve()))
    relativize(out, repo)
    p = Profile.open(out)
    names = [r[0] for r in p.duckdb().execute(
        "SELECT DISTINCT CAST(src_file AS VARCHAR) FROM events UNION "
        "SELECT DISTINCT CAST(file AS VARCHAR) FROM stacks"
    ).fetchall() if r[0]]  # fmt: skip
    assert "samples/tiny.py" in names
    assert not [n for n in names if n.startswith("/")], names
    assert "torch/nn/modules/module.py" in names  # an installed package by its import path
    assert str(repo) not in (out / "manifest.json").read_text()
    assert before and p.source_text("samples/tiny.py") == before
    kept = [f.relative_to(out / "sources").as_posix() for f in (out / "sources").rglob("*.py")]
    assert "samples/tiny.py" in kept  # (pytest's own files are library code run here too)
    assert not [k for k in kept if k.startswith(str(repo).lstrip("/").split("/")[0] + "/")]


def test_the_committed_samples_name_no_path_of_the_machine_that_captured_them():
    root = Path(__file__).resolve().parent.parent
    for d in sorted((root / "samples" / "profiles").iterdir()):
        p = Profile.open(d)
        rows = (
            p.duckdb()
            .execute(
                "SELECT DISTINCT CAST(src_file AS VARCHAR) FROM events UNION "
                "SELECT DISTINCT CAST(model_file AS VARCHAR) FROM events UNION "
                "SELECT DISTINCT CAST(file AS VARCHAR) FROM stacks"
            )
            .fetchall()
        )
        absolute = [r[0] for r in rows if r[0] and r[0].startswith("/")]
        assert not absolute, (d.name, absolute[:3])
        assert str(root) not in (d / "manifest.json").read_text(), d.name
        kept = (
            [f for f in (d / "sources").rglob("*") if f.is_file()]
            if (d / "sources").exists()
            else []
        )
        assert all(f.relative_to(d / "sources").parts[0] != "work" for f in kept), d.name

"""Profiles the web tests serve (no tests here): real Kineto traces imported by the importer,
a real neuron capture from samples/profiles, a neuron-shaped profile from
benchmarks/web_synth.py (exact, known structure), a trace whose op names and file names carry HTML, a corrupt profile, and a symlink that
points out of the served directory."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from neuron_explorer.importers import import_traces

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT / "tests" / "data" / "kineto-gpu"
COPIED = {
    "alexnet": "alexnet",
    "base": "compare_base",
    "test": "compare_test",
    "cpu_mlp": "cpu_mlp",
}
SAMPLE_CAPTURE = ROOT / "samples" / "profiles" / "gpt_train"  # a real capture on the neuron device
FALLBACK_CAPTURE = ROOT / "samples" / "profiles" / "fallback_float64"  # readiness problems
BASE_TRACE = SHARED / "trace_compare_base_base.json.gz"
XSS_OP = "<script>window.__xss=1</script>"
XSS_OP2 = "aten::mm\"'><img src=x onerror=window.__xss=2>"
XSS_FILE = "/home/u/evil<script>window.__xss=3</script>.py"


def synth_module():
    spec = importlib.util.spec_from_file_location("web_synth", ROOT / "benchmarks" / "web_synth.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def xss_trace(path: Path) -> Path:
    """A small Kineto trace whose op names and source file name are HTML and script."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
         "ts": 1000, "dur": 500, "args": {}},
        {"ph": "X", "cat": "python_function", "name": f"{XSS_FILE}(3): f", "pid": 1, "tid": 1,
         "ts": 1005, "dur": 300, "args": {"Python id": 1, "Python parent id": 0}},
        {"ph": "X", "cat": "cpu_op", "name": XSS_OP, "pid": 1, "tid": 1, "ts": 1010, "dur": 100,
         "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": XSS_OP2, "pid": 1, "tid": 1, "ts": 1200, "dur": 100,
         "args": {}},
    ]  # fmt: skip
    path.write_text(
        json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_700_000_000 * 10**9})
    )
    return path


def build_root(tmp: Path, imported: dict[str, Path]) -> Path:
    """A served directory: alexnet, base, test (shared GPU traces), cpu_mlp (the sample trace,
    with its source kept), gpt (samples/profiles/gpt_train, captured on the neuron device), fallback
    (samples/profiles/fallback_float64, with CPU fallbacks and float64),
    neuron (synthetic, 6,000 events), xss, corrupt, and a symlink `escape` to a valid
    profile outside it. `imported` is conftest's imported_profiles."""
    root = tmp / "profiles"
    root.mkdir()
    for name, key in COPIED.items():
        shutil.copytree(imported[key], root / name)
    shutil.copytree(SAMPLE_CAPTURE, root / "gpt")
    shutil.copytree(FALLBACK_CAPTURE, root / "fallback")
    synth_module().make_profile(root / "neuron", 6000)
    import_traces([xss_trace(tmp / "xss.json")], root / "xss")
    shutil.copytree(imported["compare_base"], root / "corrupt")
    (root / "corrupt" / "events.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    shutil.copytree(imported["compare_base"], tmp / "outside")
    os.symlink(tmp / "outside", root / "escape")
    # a source file kept in the profile that is really a link to a file outside it
    (tmp / "secret.py").write_text("SECRET = 1\n")
    evil = root / "neuron" / "sources" / "etc"
    evil.mkdir(parents=True)
    os.symlink(tmp / "secret.py", evil / "secret.py")
    return root

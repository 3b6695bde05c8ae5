"""Every code block in README.md and docs/ runs as written and does what the text says.

A block's fence says how it is checked: ```sh blocks run through bash with the real CLI (the
project's venv first on PATH) in a sandbox holding the files they name; ```python blocks run as
scripts there; ```sql blocks run through `neuron-explorer query` on a captured sample profile;
```json blocks parse. ```text blocks are synopses, layouts and output, not commands. A block
with no language fails the test, so a new block must say which it is."""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "kineto-gpu"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"text", "sh", "python", "sql", "json"}
# Blocks run elsewhere, or that need what is not installed here.
ELSEWHERE = {
    "docs/format.md": "tests/test_cli_docs.py runs its SQL and Python against written profiles",
    "docs/fleet.md": "tests/test_fleet.py runs its queries as written in a local Spark (make test-sweep)",
}
FENCE = re.compile(r"^```([\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository
    line: int
    lang: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.lang or 'no language'})"


def blocks(path: Path) -> list[Block]:
    found, lines = [], path.read_text().splitlines()
    start, lang = None, ""
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if not m:
            continue
        if start is None:
            start, lang = i, m.group(1)
        else:
            code = "\n".join(lines[start + 1 : i]) + "\n"
            found.append(Block(str(path.relative_to(ROOT)), start + 1, lang, code))
            start = None
    return found


def _of(name: str, *langs: str) -> list[Block]:
    return [b for b in blocks(ROOT / name) if b.lang in langs]


def test_every_block_says_how_it_is_checked():
    untagged = [str(b) for p in DOCS for b in blocks(p) if b.lang not in LANGUAGES]
    assert not untagged, f"give each block one of {sorted(LANGUAGES)}: {untagged}"


@pytest.mark.parametrize("block", [b for p in DOCS for b in blocks(p) if b.lang == "json"], ids=str)
def test_json_blocks_parse(block):
    json.loads(block.code.replace('"..."', '"x"'))


# --- the sandbox: the files the documented commands name --------------------------------------

TRAIN_PY = """
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
model = torch.nn.Linear(32, 8).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.epochs):
    for _ in range(8):
        loss = model(torch.randn(16, 32, device="neuron")).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # `import torch` registers the device
    return env


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN_PY)
    gpu = DATA / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
    shutil.copy(gpu, tmp_path / "trace.pt.trace.json.gz")
    (tmp_path / "logs").mkdir()
    trace = json.loads(gzip.decompress(gpu.read_bytes()))
    for rank in (0, 1):  # one job of two ranks: the real trace, as each rank of a pair
        trace["distributedInfo"] = {**trace.get("distributedInfo", {}), "rank": rank,
                                    "world_size": 2}  # fmt: skip
        out = tmp_path / "logs" / f"rank_{rank}.json.gz"
        out.write_bytes(gzip.compress(json.dumps(trace).encode()))
    (tmp_path / "samples").symlink_to(ROOT / "samples")
    (tmp_path / "profiles").mkdir()
    return tmp_path


def _run_bash(code: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"{code}\n--- stderr:\n{proc.stderr[-3000:]}"
    return proc


def _serve(line: str, cwd: Path) -> str:
    """A documented `serve` line: started (on a free port: a fixed one may be taken on a shared
    machine), its first page fetched, then stopped."""
    argv = shlex.split(line, comments=True) + ["--port", "0"]
    proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        url = re.search(r"http://127\.0\.0\.1:\d+/\S*", first)
        assert url, f"{line}: {first}"
        with urllib.request.urlopen(url.group(0), timeout=60) as r:
            assert r.status == 200
            return r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_sh(block: Block, cwd: Path) -> str:
    """Run a ```sh block in `cwd`: all of it through bash, serve lines as `_serve` does."""
    out, chunk = [], []
    for line in block.code.splitlines():
        if line.startswith("neuron-explorer serve"):
            if chunk:
                out.append(_run_bash("\n".join(chunk), cwd).stdout)
                chunk = []
            assert "<html" in _serve(line, cwd)
        else:
            chunk.append(line)
    if chunk:
        out.append(_run_bash("\n".join(chunk), cwd).stdout)
    return "".join(out)


def _steps(path: Path) -> list[int]:
    from neuron_explorer.model import Profile

    return [s.step for s in Profile.open(path).manifest.steps]


# --- the pages --------------------------------------------------------------------------------


@pytest.mark.sweep  # a profiled loop, a capture and every command: ~70 s (default suite < 15 min)
def test_readme_snippets_run_as_written(sandbox):
    (python,) = _of("README.md", "python")
    proc = subprocess.run([sys.executable, "-c", python.code], cwd=sandbox, env=_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # "It writes one profile, profiles/run1, of steps 2, 3 and 4" (23 batches, repeat=1)
    assert sorted(p.name for p in (sandbox / "profiles").iterdir()) == ["run1"]
    assert _steps(sandbox / "profiles" / "run1") == [2, 3, 4]
    (commands,) = _of("README.md", "sh")
    out = run_sh(commands, sandbox)
    assert _steps(sandbox / "profiles" / "run2") == [2, 3, 4]  # optimizer steps, the default
    assert (sandbox / "profiles" / "gpu-run" / "manifest.json").is_file()
    assert (sandbox / "profiles" / "run1.perfetto.json.gz").is_file()
    assert "Step-time breakdown" in out and "rows" in out  # summary's and query's tables
    # the example SQL (the same text) lists ops, not the profiler's own spans
    (sql,) = re.findall(r'query profiles/run1 "([^"]+)"', commands.code)
    proc = _run_bash(f'neuron-explorer query profiles/run1 "{sql}" --json', sandbox)
    res = json.loads(proc.stdout)
    names = [row[res["columns"].index("name")] for row in res["rows"]]
    assert len(names) == 10 and all("::" in n or "Backward" in n for n in names), names
    assert not [n for n in names if n.startswith(("ProfilerStep", "PyTorch Profiler"))]
    assert not [b for b in blocks(ROOT / "README.md") if b.lang not in ("python", "sh", "text")]


@pytest.mark.sweep  # every example of docs/cli.md: ~20 s quiet, ~50 s loaded (suite < 15 min)
def test_cli_reference_snippets_run_as_written(sandbox):
    for name in ("run1", "run2"):  # the profiles the examples compare
        shutil.copytree(ROOT / "samples" / "profiles" / "gpt_train", sandbox / "profiles" / name)
    for block in _of("docs/cli.md", "sh"):
        run_sh(block, sandbox)
    assert (sandbox / "profiles" / "8-ranks" / "manifest.json").is_file()
    assert (sandbox / "profiles" / "gpt" / "manifest.json").is_file()
    assert (sandbox / "tables" / "events.csv").is_file()
    assert (sandbox / "report.md").read_text().strip()


@pytest.mark.slow  # a fresh interpreter with torch per block: 8-18 s a page
@pytest.mark.parametrize(
    "name",
    [
        # device.md runs its scripts on the device: ~14 s quiet, in the sweeps (suite < 15 min)
        pytest.param(p.name, marks=pytest.mark.sweep) if p.name == "device.md" else p.name
        for p in DOCS
        if p.parent.name == "docs" and f"docs/{p.name}" not in ELSEWHERE
    ],
)
def test_doc_python_and_shell_snippets_run_as_written(name, sandbox):
    if name == "cli.md":
        pytest.skip("test_cli_reference_snippets_run_as_written runs docs/cli.md")
    for block in _of(f"docs/{name}", "python"):
        proc = subprocess.run([sys.executable, "-c", block.code], cwd=sandbox, env=_env(),
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, f"{block}\n{proc.stderr[-3000:]}"
    for block in _of(f"docs/{name}", "sh"):
        run_sh(block, sandbox)


@pytest.mark.parametrize("name", [f"docs/{p.name}" for p in DOCS if p.parent.name == "docs"])
def test_sql_snippets_run_on_a_captured_profile(name, capsys):
    if name in ELSEWHERE:
        pytest.skip(ELSEWHERE[name])
    from neuron_explorer.cli import main

    profile = str(ROOT / "samples" / "profiles" / "gpt_train")
    for block in _of(name, "sql"):
        assert main(["query", profile, block.code, "--json"]) == 0, str(block)
        result = json.loads(capsys.readouterr().out)
        assert result["columns"], str(block)


def test_pages_run_elsewhere_hold_only_what_runs_there():
    for name, why in ELSEWHERE.items():
        langs = {b.lang for b in blocks(ROOT / name)}
        assert langs <= {"text", "sql", "python", "json"}, (name, why, langs)

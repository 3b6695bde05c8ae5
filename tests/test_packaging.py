"""The package as a user meets it: a CLI that answers --help and --version at once, one
distinctive import name, and a user project with its own `backend`, `web` and `explorer`
packages that captures and imports as it should. (The built wheel in a fresh venv is
.ci/wheel-smoke, run by CI.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_explorer.entry import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "pyarrow", "torch", "duckdb", "fastapi", "uvicorn", "rich")

# runs the CLI's main in a fresh interpreter, then reports which heavy modules it imported
_PROBE = """
import contextlib, io, json, sys
from neuron_explorer.entry import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"heavy": heavy, "out": out.getvalue()}}))
"""


def _probe(*argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("argv", [["--version"], ["--help"], *([c, "--help"] for c in COMMANDS)])
def test_help_and_version_import_nothing_heavy(argv):
    # the time is in the imports: numpy and pyarrow alone are ~0.8 s of a 1.1 s --version
    result = _probe(*argv)
    assert result["heavy"] == [], f"{' '.join(argv)} imported {result['heavy']}"
    if argv == ["--version"]:
        assert result["out"].strip() == "neuron-explorer 0.1.0"
    else:
        assert "usage: neuron-explorer" in result["out"]


def test_the_distribution_installs_one_package_name():
    import tomllib
    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(str(ROOT), **config["packages"]["find"])
    assert packages and all(p.split(".")[0] == "neuron_explorer" for p in packages), packages
    # every C++ source the runtime builds at first use ships with it (autocast.cpp did not)
    sources = sorted(p.name for p in (ROOT / "neuron_explorer/backend/runtime").glob("*.cpp"))
    assert {"guard.cpp", "kineto_plugin.cpp"} <= set(sources)
    assert sorted(config["package-data"]["neuron_explorer.backend.runtime"]) == sources


# A user project whose own packages have the names the old layout used at top level.
_USER_PROJECT = {
    "backend/__init__.py": "",
    "backend/model.py": """
        import torch


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(16, 8)

            def forward(self, x):
                return self.fc(x).relu()  # the user's line
    """,
    "web/__init__.py": "NAME = 'the user web package'\n",
    "explorer/__init__.py": "NAME = 'the user explorer package'\n",
    "main.py": """
        import torch

        import backend
        import explorer
        import web
        from backend.model import Net

        print("backend", backend.__file__)
        print("web", web.NAME, "explorer", explorer.NAME)
        model = Net().to("neuron")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            loss = model(torch.randn(4, 16, device="neuron")).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """,
}


@pytest.mark.slow  # a capture on the neuron device in a subprocess: ~10 s
def test_a_user_project_with_its_own_backend_and_web_packages(tmp_path):
    project = tmp_path / "project"
    for name, text in _USER_PROJECT.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(textwrap.dedent(text))
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_explorer", "capture", "-o", "out", "--", "python",
         "main.py"],
        cwd=project, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the user's packages are the user's, and ours still registered the device
    assert f"backend {project / 'backend' / '__init__.py'}" in proc.stdout
    assert "web the user web package explorer the user explorer package" in proc.stdout
    from neuron_explorer.model import Profile

    profile = Profile.open(project / "out")
    kernels = (
        profile.duckdb()
        .execute(
            "SELECT src_file, src_line, count(*) FROM events WHERE kind = 'kernel' "
            "AND op_name LIKE '%relu%' GROUP BY 1, 2"
        )
        .fetchall()
    )
    model_py = str((project / "backend" / "model.py").resolve())
    assert [(f, line) for f, line, _ in kernels] == [(model_py, 11)], kernels
    assert any(p.name == "model.py" for p in (project / "out" / "sources").rglob("*.py"))

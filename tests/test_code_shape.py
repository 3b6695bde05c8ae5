"""The analysis, web and CLI code stay small (issue 16): no module over 400 lines, no function
over 60, so each concept can be read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "neuron_explorer"
PACKAGES = ("analysis", "web", "cli", "agents")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def _modules() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_stay_small(path: Path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: over {MAX_MODULE_LINES}"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            assert lines <= MAX_FUNCTION_LINES, f"{path.name}:{node.lineno} {node.name}: {lines}"


@pytest.mark.parametrize(
    "path", sorted((ROOT / "web" / "static" / "js").glob("*.js")), ids=lambda p: p.name
)
def test_page_scripts_stay_small(path: Path):
    """Each page's JavaScript module too (functions are not measured: no JS parser here)."""
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.name}: {lines} lines, over {MAX_MODULE_LINES}"

"""Layers point one way (DESIGN.md): a module never imports from a layer above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("neuron_explorer",)
NE = "neuron_explorer"
B, M, IMP, X, A, C, CLI, W = (
    f"{NE}.backend", f"{NE}.model", f"{NE}.importers", f"{NE}.exporters", f"{NE}.analysis",
    f"{NE}.capture", f"{NE}.cli", f"{NE}.web",
)  # fmt: skip

# module prefix -> prefixes it must never import
FORBIDDEN = {
    B: (M, IMP, X, A, C, CLI, W),
    M: (C, IMP, X, A, CLI, W, B),
    IMP: (C, A, CLI, W),
    X: (C, A, CLI, W),
    A: (C, IMP, X, CLI, W),
    C: (A, CLI, W),
    CLI: (f"{W}.app",),  # the serve command imports web lazily through web.serve
}  # fmt: skip
AG = f"{NE}.agents"  # the MCP server and the report: on top, beside web; only the CLI uses it
for _below in (B, M, IMP, X, A, C, W):
    FORBIDDEN[_below] = (*FORBIDDEN.get(_below, ()), AG)
FORBIDDEN[AG] = (CLI,)


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            yield ".".join(parts), path


def _imports(module: str, path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                yield ".".join([*base, node.module] if node.module else base)
            elif node.module:
                yield node.module


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("module,path", list(_modules()), ids=lambda x: str(x))
def test_no_backward_import(module, path):
    rules = [bad for owner, bad in FORBIDDEN.items() if _under(module, owner)]
    for imported in _imports(module, path):
        for bad in (b for group in rules for b in group):
            assert not _under(imported, bad), (
                f"{module} imports {imported} (layer {bad} is above it)"
            )


@pytest.mark.parametrize("module,path", list(_modules()), ids=lambda x: str(x))
def test_only_capture_reads_the_live_profiler(module, path):
    if _under(module, C) or _under(module, B):
        return
    for imported in _imports(module, path):
        assert not _under(imported, "torch.profiler"), f"{module} reads the live profiler"

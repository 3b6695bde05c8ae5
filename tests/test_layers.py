"""Layers point one way (docs/architecture.md): ONE ordered list below, bottom first, covers
every package and top-level module of neuron_explorer. A module may import only layers at or
below its own; packages that share a line are siblings and may not import each other. A module
the list does not name fails, and so does any import cycle between modules."""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NE = "neuron_explorer"

# bottom to top; each line is one layer, its names siblings (a name covers its whole package)
LAYERS: tuple[tuple[str, ...], ...] = (
    (NE,),  # the package root itself (its __init__ only): __version__, the lazy public names
    (f"{NE}.vocab", f"{NE}.errors"),  # pure-Python vocabulary; the error types
    (f"{NE}.backend",),  # the neuron device
    (f"{NE}.model",),  # the profile format: schema, reading and writing, combining ranks
    (f"{NE}.importers", f"{NE}.exporters"),
    (f"{NE}.fleet",),  # a Spark import of many ranks: runs the importers, writes the model
    (f"{NE}.analysis",),  # every page model, the rules
    (f"{NE}.capture",),  # the live profiler to a profile (merges the backend's records)
    (f"{NE}.cli",),  # text renderers of the analysis; never imports web or agents
    (f"{NE}.web",),  # the view registry and its `serve` command
    (f"{NE}.agents",),  # MCP and the report, over web's /api/ in-process
    (f"{NE}.entry",),  # the top: the CLI assembled from every layer's commands
    (f"{NE}.__main__",),  # python -m neuron_explorer
)
# the package root re-exports capture's trace_handler and profile for users (`import
# neuron_explorer; neuron_explorer.trace_handler(...)`), imported only when first asked for
EXCEPTIONS = {
    (NE, f"{NE}.capture"): "the public trace_handler/profile, imported lazily",
    (NE, f"{NE}.backend"): "the public shapes_only() context manager, imported lazily",
}
# packages with cycles that are being removed, with who removes them: a cycle wholly inside one
# of them passes; an entry whose package has no cycle left fails, so the list only shrinks
KNOWN_CYCLES: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / NE).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of import nodes under `if TYPE_CHECKING:` (annotations only, never run)."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


@cache
def imports_of(module: str) -> tuple[str, ...]:
    """The neuron_explorer modules `module` imports (at import time or inside a function), each
    resolved to the module it names: `from pkg import sub` is pkg.sub, `from pkg import f`
    is pkg."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - (node.level - 1)]
                pkg = ".".join([*up, node.module] if node.module else up)
            else:
                pkg = node.module or ""
            for alias in node.names:
                sub = f"{pkg}.{alias.name}"
                found.append(sub if sub in MODULES else pkg)
    return tuple(dict.fromkeys(m for m in found if m == NE or m.startswith(NE + ".")))


def layer_of(module: str) -> tuple[int, str]:
    """(the layer's index, the list's name) for a module; the root matches only itself."""
    best = None
    for i, names in enumerate(LAYERS):
        for name in names:
            hit = module == name or (name != NE and module.startswith(name + "."))
            if hit and (best is None or len(name) > len(best[1])):
                best = (i, name)
    if best is None:
        raise LookupError(module)
    return best


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_has_a_layer(module):
    try:
        layer_of(module)
    except LookupError:
        pytest.fail(f"{module} is in no layer of tests/test_layers.py LAYERS: add it where "
                    "its imports put it")  # fmt: skip


def _violations(module: str) -> list[str]:
    mine, own = layer_of(module)
    out = []
    for imported in imports_of(module):
        theirs, name = layer_of(imported)
        if name == own or (own, name) in EXCEPTIONS:
            continue
        if theirs > mine:
            out.append(f"{module} imports {imported}: layer {name} is above {own}")
        elif theirs == mine:
            out.append(f"{module} imports {imported}: {name} and {own} are siblings")
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_points_up_or_sideways(module):
    assert _violations(module) == []


def test_the_layer_check_can_fail(monkeypatch):
    # the CLI reaching up into web, and importers reaching sideways into exporters, are refused
    planted = {f"{NE}.cli": (f"{NE}.web.app",), f"{NE}.importers": (f"{NE}.exporters",)}
    monkeypatch.setattr(sys.modules[__name__], "imports_of", planted.__getitem__)
    assert "above" in _violations(f"{NE}.cli")[0]
    assert "siblings" in _violations(f"{NE}.importers")[0]


def test_exceptions_are_still_needed():
    for owner, target in EXCEPTIONS:
        assert any(layer_of(i)[1] == target for i in imports_of(owner)), (
            f"{owner} no longer imports {target}: drop the exception"
        )


def _excepted(module: str, imported: str) -> bool:
    return (layer_of(module)[1], layer_of(imported)[1]) in EXCEPTIONS


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(MODULES):
        if start in index:
            continue
        work = [(start, iter(imports_of(start)))]
        index[start] = low[start] = len(index)
        stack.append(start), on.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in MODULES or nxt == node or _excepted(node, nxt):
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt), on.add(nxt)
                    work.append((nxt, iter(imports_of(nxt))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycles():
    found = _cycles()

    def inside(cycle: list[str], package: str) -> bool:
        return all(m == package or m.startswith(package + ".") for m in cycle)

    new = [c for c in found if not any(inside(c, known) for known in KNOWN_CYCLES)]
    assert not new, "import cycles (late imports included):\n" + "\n".join(
        " <-> ".join(c) for c in new
    )
    gone = [k for k in KNOWN_CYCLES if not any(inside(c, k) for c in found)]
    assert not gone, f"cycles listed in KNOWN_CYCLES no longer exist, drop them: {gone}"


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    # the check above must be able to fail: two modules importing each other are one cycle
    a, b = f"{NE}.cli", f"{NE}.cli.tables"
    real = imports_of.__wrapped__

    def fake(module):
        return {a: (b,), b: (a,)}.get(module, real(module))

    monkeypatch.setattr(sys.modules[__name__], "imports_of", fake)
    assert [a, b] in _cycles()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_capture_reads_the_live_profiler(module):
    if layer_of(module)[1] in (f"{NE}.capture", f"{NE}.backend"):
        return
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = (
            [a.name for a in node.names] if isinstance(node, ast.Import)
            else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )  # fmt: skip
        for name in names:
            assert not (name == "torch.profiler" or name.startswith("torch.profiler.")), (
                f"{module} reads the live profiler"
            )

"""Every API a rule tells the user to call exists (issue 14), and torch.neuron's op tracking."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch

import neuron_explorer
import neuron_explorer.backend  # registers torch.neuron

RULES = Path(neuron_explorer.__file__).parent / "analysis" / "rules"
_DOTTED = re.compile(r"\b((?:torch|neuron_explorer)(?:\.\w+)+)(\()?")


def _rule_texts(path: Path) -> list[str]:
    """Every string in a rule module: its fix, the literal parts of its detail f-strings, its
    docstrings (what the user reads in a finding or in docs/rules.md)."""
    return [
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _call_text(text: str, open_at: int) -> str:
    """The `(...)` starting at text[open_at], balanced; '' when the text cuts it off."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at : i + 1]
    return ""


def named_apis() -> list[tuple[str, str, str]]:
    """(rule file, dotted name, call text or '') for every torch / neuron_explorer name."""
    found = set()
    for path in sorted(RULES.glob("*.py")):
        for text in _rule_texts(path):
            for m in _DOTTED.finditer(text):
                call = _call_text(text, m.start(2)) if m.group(2) else ""
                found.add((path.name, m.group(1), call))
    return sorted(found)


def _resolve(dotted: str):
    parts = dotted.split(".")
    obj = {"torch": torch, "neuron_explorer": neuron_explorer}[parts[0]]
    for i, part in enumerate(parts[1:], start=2):
        try:
            obj = getattr(obj, part)
        except AttributeError:  # a subpackage the user imports (torch.distributed.pipelining)
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                raise AttributeError(f"the rule names {dotted}, which does not exist") from None
    return obj


def _literal_only(node: ast.AST) -> bool:
    """True when a call's arguments are literals or torch attributes: then the test calls it."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id not in ("torch",):
            return False
        if isinstance(n, ast.Constant) and n.value is Ellipsis:
            return False
    return True


def test_rule_texts_name_apis():
    # the extraction itself: the rules name at least these (if one is renamed, update here)
    names = {name for _f, name, _c in named_apis()}
    assert {"torch.neuron.get_fallback_ops", "torch.compile", "torch.autocast"} <= names


@pytest.mark.parametrize("rule_file,dotted,call", named_apis())
def test_every_api_a_rule_names_exists(rule_file, dotted, call):
    obj = _resolve(dotted)
    if not call:
        return
    elided = ", ..." in call  # "schedule(wait=1, warmup=1, ...)": the rest left to the user
    expr = ast.parse(f"f{call.replace(', ...', '')}", mode="eval").body
    assert isinstance(expr, ast.Call), f"{rule_file}: cannot read {dotted}{call}"
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):  # a C builtin (torch.zeros): no signature to check against
        params = None
    if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        for kw in expr.keywords:
            assert kw.arg in params, f"{rule_file}: {dotted}() has no keyword {kw.arg!r}"
    if dotted.startswith("torch.cuda.") and not torch.cuda.is_available():
        return  # a CUDA trace's advice: the name exists, there is no CUDA device to call it on
    if not elided and _literal_only(expr):
        args = [
            eval(compile(ast.Expression(a), rule_file, "eval"), {"torch": torch}) for a in expr.args
        ]
        kwargs = {
            kw.arg: eval(compile(ast.Expression(kw.value), rule_file, "eval"), {"torch": torch})
            for kw in expr.keywords
        }
        obj(*args, **kwargs)  # the call as the finding writes it runs


def test_torch_neuron_op_tracking():
    torch.neuron.clear_op_tracking()
    x = torch.arange(6.0, device="neuron")
    (x * 2).sum()
    torch.nonzero(x > 2)  # data-dependent shape: a CPU fallback
    executed, fallback = torch.neuron.get_executed_ops(), torch.neuron.get_fallback_ops()
    assert "aten::mul" in executed and "aten::sum" in executed
    assert fallback == ["aten::nonzero"]
    assert fallback == neuron_explorer.backend.get_fallback_ops()
    torch.neuron.clear_op_tracking()
    assert torch.neuron.get_executed_ops() == [] and torch.neuron.get_fallback_ops() == []

"""Two profiles side by side: steps, breakdown, ops, lines, kernels and findings with deltas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Query

from neuron_explorer.analysis import hotspots

from ..pages import Api, Page, Shell
from ..views import compare

if TYPE_CHECKING:
    from ..service import Service


def _side(svc: Service, name: str) -> compare.Side:  # what the comparison reads, cached
    p = svc.store.open(name)
    nodes = svc.store.derived(name, "module_tree", lambda p: hotspots.module_tree(p, p.duckdb()))
    return compare.side_of(name, p, svc.summary(name), svc.ops(name), svc.lines(name),
                           svc.kernels(name), nodes, svc.findings(name))  # fmt: skip


def api_compare(svc: Service, a: str = Query(...), b: str = Query(...)) -> dict[str, Any]:
    """B against A: analysis.compare's document (`neuron-explorer diff --json`) + file ids."""
    return compare.compare_json(_side(svc, a), _side(svc, b))


PAGES = (Page("compare", "/compare", api_compare, Shell("Compare", "compare.js", plotly=True)),)
API: tuple[Api, ...] = ()

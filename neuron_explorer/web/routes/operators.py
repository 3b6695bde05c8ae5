"""Framework ops (the table and one op's expansion) and the nn.Module tree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuron_explorer.analysis import hotspots

from ..pages import Api, Page, Shell
from ..views import operators, overview

if TYPE_CHECKING:
    from ..service import Service


def api_operators(svc: Service, name: str) -> dict[str, Any]:
    p = svc.store.open(name)
    return {"name": name, **operators.operators_json(svc.ops(name), p.manifest.device_spec,
                                                     overview.is_modeled(p))}  # fmt: skip


def api_operator(svc: Service, name: str, op: str) -> dict[str, Any]:
    svc.store.open(name)
    return operators.operator_detail(svc.store.connection(name), op)


def api_modules(svc: Service, name: str) -> dict[str, Any]:
    store = svc.store
    p = store.open(name)
    nodes = store.derived(name, "module_tree", lambda p: hotspots.module_tree(p, p.duckdb()))
    ops = store.derived(name, "module_ops", lambda p: hotspots.module_ops(p, p.duckdb()))
    page = hotspots.Modules(tuple(nodes), tuple(ops), overview.is_modeled(p))
    return {"name": name, **page.to_dict()}


PAGES = (
    Page("operators", "/p/{name}/operators", api_operators,
         Shell("Operators", "operators.js", plotly=True, tab="Operators")),
    Page("modules", "/p/{name}/modules", api_modules,
         Shell("Modules", "modules.js", plotly=True, tab="Modules")),
)  # fmt: skip
API = (Api("/api/p/{name}/operators/detail", api_operator, "operators"),)

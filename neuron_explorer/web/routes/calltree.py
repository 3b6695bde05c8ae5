"""The call tree and flame graph of host time, and the events of one source line or one module
(which the timeline outlines when the source view or the Modules page links to it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Query

from neuron_explorer.analysis.calltree import call_tree
from neuron_explorer.analysis.line_events import MAX_EVENTS, line_events, module_events

from ..pages import Api, Page, Shell
from ..views import overview, source

if TYPE_CHECKING:
    from ..service import Service


def api_calltree(
    svc: Service, name: str, by: str = Query("stack", pattern="^(stack|module)$")
) -> dict[str, Any]:
    p = svc.store.open(name)
    tree = svc.persisted(name, f"calltree_{by}", lambda p: call_tree(p, by).to_dict())
    # a frame links to the source view when the profile's lines know its file
    known = {source.file_id(f) for f in svc.lines(name).column("file").to_pylist() if f}
    known |= {source.file_id(f) for f in svc.model_lines(name).column("file").to_pylist() if f}
    nodes = []
    for n in tree["nodes"]:
        fid = source.file_id(n["file"]) if n.get("file") else None
        nodes.append({**n, "file_id": fid if fid in known else None})
    return {"name": name, "device_time_modeled": overview.is_modeled(p), **tree, "nodes": nodes}


def api_line_events(
    svc: Service, name: str, file_id: str, line: int, limit: int = Query(MAX_EVENTS, ge=1)
) -> dict[str, Any]:
    svc.store.open(name)
    # the file id as the source page that links here named it: from the line tables it read
    # (an excerpt's, when the whole profile's are over the ceiling), the events the whole's
    path = svc.source_file(svc.analysed(name), file_id)
    found = line_events(svc.store.connection(name), path, line, limit)
    return {"name": name, "file_id": file_id, **found.to_dict()}


def api_module_events(
    svc: Service, name: str, module: str = Query(..., max_length=4096),
    limit: int = Query(MAX_EVENTS, ge=1),
) -> dict[str, Any]:  # fmt: skip
    svc.store.open(name)
    return {"name": name, **module_events(svc.store.connection(name), module, limit).to_dict()}


PAGES = (
    Page("calltree", "/p/{name}/calltree", api_calltree,
         Shell("Call tree", "calltree.js", plotly=True, tab="Call tree")),
)  # fmt: skip
API = (
    Api("/api/p/{name}/source/{file_id}/lines/{line}/events", api_line_events, "timeline"),
    Api("/api/p/{name}/modules/events", api_module_events, "timeline"),
)

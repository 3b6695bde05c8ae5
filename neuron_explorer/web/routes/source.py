"""Source hotspots: the files, one file's annotated listing, and one line's work."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Query

from neuron_explorer.analysis.lines import MAX_CONTEXT_LINES

from ..pages import Api, Page, Shell
from ..views import overview, source

if TYPE_CHECKING:
    from ..service import Service

# which frame is "the line" in the source view: your code, model code or every frame
LEVEL = Query("model", pattern="^(user|model|all)$")
SOURCE = Shell("Source", "source.js", tab="Source")


def api_source(svc: Service, name: str, level: str = LEVEL) -> dict[str, Any]:
    p = svc.store.open(name)
    return {"name": name, **source.source_json(p, svc.lines(name), svc.model_lines(name, level),
                                               level)}  # fmt: skip


def api_source_file(
    svc: Service, name: str, file_id: str, level: str = LEVEL,
    around: int | None = Query(None, ge=1, le=2**31 - 1),
    context: int = Query(50, ge=0, le=MAX_CONTEXT_LINES),
) -> dict[str, Any]:  # fmt: skip
    p = svc.store.open(name)
    path = svc.source_file(name, file_id)
    return {"name": name, "level": level,
            **source.file_json(p, svc.lines(name), path, overview.is_modeled(p),
                               svc.model_lines(name, level), around, context)}  # fmt: skip


def api_source_line(svc: Service, name: str, file_id: str, line: int) -> dict[str, Any]:
    svc.store.open(name)
    return source.line_detail(svc.store.connection(name), svc.source_file(name, file_id), line)


PAGES = (
    Page("source", "/p/{name}/source", api_source, SOURCE),
    Page("source", "/p/{name}/source/{file_id}", api_source_file, SOURCE),
)
API = (Api("/api/p/{name}/source/{file_id}/lines/{line}", api_source_line, "source"),)

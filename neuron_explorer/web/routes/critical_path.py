"""A step's critical path (analysis.critical_path) and its what-if replay (analysis.whatif):
the page draws the path on the step's time axis, lists its ops by share, and replays the step
with the changes typed into it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Query
from fastapi.responses import JSONResponse

from neuron_explorer.analysis.critical_path import critical_path
from neuron_explorer.analysis.whatif import whatif
from neuron_explorer.errors import ExplorerError

from ..pages import Api, Page, Shell

if TYPE_CHECKING:
    from ..service import Service


SPEEDUPS = Query(None, max_length=20)  # a repeated query parameter: FastAPI needs Query


def api_critical_path(
    svc: Service, name: str, step: int | None = None, rank: int | None = Query(None, ge=0),
    annotation: str | None = Query(None, max_length=500), instance: int = Query(0, ge=0),
) -> dict[str, Any]:  # fmt: skip
    """The critical path of one step (the median one unless `step`), or of an annotation's
    `instance`-th span; a step, rank or annotation the profile lacks is a 400."""
    p = svc.store.open(name)
    with svc.memory.running():  # admitted as the pages the import does not store (503)
        svc.admit(name, page=True)
        try:
            with svc.store.profile_lock(name):
                return critical_path(p, step, annotation, instance, rank).to_dict()
        except ExplorerError as e:
            return JSONResponse({"error": str(e)}, status_code=400)  # type: ignore[return-value]


def api_whatif(
    svc: Service, name: str, speedup: list[str] | None = SPEEDUPS,
    drop_syncs: bool = False, chip: str | None = Query(None, max_length=16),
    step: int | None = None, annotation: str | None = Query(None, max_length=500),
    instance: int = Query(0, ge=0),
) -> dict[str, Any]:  # fmt: skip
    """One step replayed with the named changes (`neuron-explorer whatif --json`); `speedup`
    repeated, or several in one separated by commas."""
    p = svc.store.open(name)
    speedup = [x.strip() for s in speedup or () for x in s.split(",") if x.strip()]
    if not (speedup or drop_syncs or chip):
        return JSONResponse({"error": "name a change: speedup, drop_syncs or chip"},
                            status_code=400)  # type: ignore[return-value]  # fmt: skip
    with svc.memory.running():
        svc.admit(name, page=True)
        try:
            with svc.store.profile_lock(name):
                return whatif(p, speedup, drop_syncs, chip, step, annotation, instance).to_dict()
        except ExplorerError as e:  # a speedup that names nothing, an unknown chip
            return JSONResponse({"error": str(e)}, status_code=400)  # type: ignore[return-value]


PAGES = (
    Page("critical-path", "/p/{name}/critical-path", api_critical_path,
         Shell("Critical path", "critical_path.js", tab="Critical path")),
)  # fmt: skip
API = (Api("/api/p/{name}/whatif", api_whatif, "critical-path"),)

"""The profile list and a profile's summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..pages import Api, Page, Shell
from ..views import operators, overview, source

if TYPE_CHECKING:
    from ..service import Service


def api_profiles(svc: Service) -> dict[str, Any]:
    rows, skipped = svc.profile_rows()
    return {"root": str(svc.store.root), "profiles": rows, "skipped": skipped}


def api_summary(svc: Service, name: str) -> dict[str, Any]:
    p = svc.store.open(name)
    m = p.manifest
    svc.tables_later(name)
    f = svc.findings(name)
    modeled = overview.is_modeled(p)
    return {
        "name": name,
        "manifest": {
            "source": m.source,
            "producer": m.producer,
            "torch_version": m.torch_version,
            "host": m.host,
            "ranks": list(m.ranks),
            "device_spec": m.device_spec,
            "devices": list(m.devices),
            "row_counts": m.row_counts,
            "inputs": list(m.inputs),
        },  # fmt: skip
        "device_time_modeled": modeled,
        "devices": svc.devices(name),
        "steps": overview.step_stats(p),
        "summary": svc.summary(name),
        "findings": None if f is None else f[:5],
        "findings_total": None if f is None else len(f),
        "top_ops": operators.operators_json(svc.ops(name), m.device_spec, modeled)["operators"][
            :10
        ],
        "top_lines": source.top_lines(svc.lines(name)),
    }


PAGES = (
    Page("profiles", "/", api_profiles, Shell("Profiles", "profiles.js"), api="/api/profiles"),
    Page("summary", "/p/{name}", api_summary,
         Shell("Summary", "summary.js", plotly=True, tab="Summary")),
)  # fmt: skip
API: tuple[Api, ...] = ()

"""The profile list and a profile's summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuron_explorer.errors import private

from ..pages import Api, Page, Shell
from ..views import overview

if TYPE_CHECKING:
    from ..service import Service


def api_profiles(svc: Service) -> dict[str, Any]:
    rows, skipped = svc.profile_rows()
    # a row's error names its file by its path in the served folder, never the machine's
    rows = [{**r, "error": svc.store.shown(r["error"])} if r.get("error") else r for r in rows]
    return {"root": private(str(svc.store.root)), "profiles": rows, "skipped": skipped}


def api_summary(svc: Service, name: str) -> dict[str, Any]:
    p = svc.store.open(name)
    svc.tables_later(name)
    # a large profile's rules (seconds) run after the page, in the background: the page
    # says "analysing..." and fetches the findings page's twin, as the profile list does
    f = svc.findings_if_quick(name)  # first: the tables are computed on the side meanwhile
    page = overview.summary_json(p, svc.devices(name), svc.summary(name), f, svc.ops(name),
                                 svc.lines(name))  # fmt: skip
    if f is None:
        svc.analyse_later([name])
    return {"name": name, "analysis_pending": f is None, **page}


PAGES = (
    Page("profiles", "/", api_profiles, Shell("Profiles", "profiles.js"), api="/api/profiles"),
    Page("summary", "/p/{name}", api_summary,
         Shell("Summary", "summary.js", plotly=True, tab="Summary")),
)  # fmt: skip
API: tuple[Api, ...] = ()

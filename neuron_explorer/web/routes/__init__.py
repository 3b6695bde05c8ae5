"""Every page and JSON route of the web UI, in one explicit list. A page is one `Page` (its HTML
shell and its JSON twin) in the PAGES of a module here; a route that is not a page is one `Api`
in its API. Tabs follow the order of MODULES. web/app.py mounts exactly these."""

from __future__ import annotations

from ..pages import Api, Page
from . import (
    calltree,
    compare,
    critical_path,
    findings,
    operators,
    overview,
    ranks,
    source,
    sql,
    timeline,
)

MODULES = (overview, timeline, operators, calltree, source, findings, critical_path, ranks, sql,
           compare)  # fmt: skip
# the pages (and their routes) that read the whole profile, however large: the others are
# analysis pages, which read a too-large profile's excerpt (Service.analysed)
WHOLE_PROFILE = ("profiles", "timeline", "sql")
PAGES: tuple[Page, ...] = tuple(p for m in MODULES for p in m.PAGES)
API: tuple[Api, ...] = tuple(a for m in MODULES for a in m.API)

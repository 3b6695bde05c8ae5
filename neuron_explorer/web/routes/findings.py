"""A profile's findings, largest saving first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..pages import Api, Page, Shell

if TYPE_CHECKING:
    from ..service import Service


def api_findings(svc: Service, name: str) -> dict[str, Any]:
    svc.store.open(name)
    return svc.findings_report(name)


PAGES = (
    Page("findings", "/p/{name}/findings", api_findings,
         Shell("Findings", "findings.js", tab="Findings")),
)  # fmt: skip
API: tuple[Api, ...] = ()

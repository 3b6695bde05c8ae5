"""The page registry: each page is an HTML shell plus one JavaScript module that reads the
page's JSON twin under /api/. Values put into the shell are escaped here."""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class Page:
    title: str
    script: str  # module under /static/js/
    plotly: bool = False  # pages with charts load plotly.js first
    tab: str | None = None  # label in a profile's tab bar


PAGES: dict[str, Page] = {
    "profiles": Page("Profiles", "profiles.js"),
    "summary": Page("Summary", "summary.js", plotly=True, tab="Summary"),
    "timeline": Page("Timeline", "timeline.js", tab="Timeline"),
    "memory": Page("Memory", "memory.js", plotly=True, tab="Memory"),
    "operators": Page("Operators", "operators.js", plotly=True, tab="Operators"),
    "modules": Page("Modules", "modules.js", plotly=True, tab="Modules"),
    "source": Page("Source", "source.js", tab="Source"),
    "findings": Page("Findings", "findings.js", tab="Findings"),
    "sql": Page("SQL", "sql.js", tab="SQL"),
    "compare": Page("Compare", "compare.js", plotly=True),
    "error": Page("Error", "common.js"),
}


@cache
def _template() -> Template:
    return Template((TEMPLATES / "page.html").read_text(encoding="utf-8"))


def _tabs(kind: str, profile: str) -> str:
    if not profile:
        return ""
    base = f"/p/{html.escape(profile)}"
    links = []
    for key, page in PAGES.items():
        if page.tab:
            href = base if key == "summary" else f"{base}/{key}"
            cls = ' class="active"' if key == kind else ""
            links.append(f'<a href="{href}"{cls}>{page.tab}</a>')
    return "".join(links)


def render_page(
    kind: str, *, title: str, profile: str = "", error: str = "", file_id: str = ""
) -> str:
    """The HTML shell of a page; `error` renders an error page instead of a script."""
    page = PAGES[kind]
    body = (
        f'<div class="error-box"><h2>Something went wrong</h2><p>{html.escape(error)}</p>'
        '<p><a href="/">Back to the profiles</a></p></div>'
        if error
        else '<div class="loading">Loading…</div>'
    )
    return _template().substitute(
        title=html.escape(title),
        page=kind,
        profile=html.escape(profile, quote=True),
        profile_label=html.escape(profile),
        file_id=html.escape(file_id, quote=True),
        tabs=_tabs(kind, profile),
        plotly='<script src="/static/plotly.min.js"></script>' if page.plotly else "",
        script="" if error else f'<script type="module" src="/static/js/{page.script}"></script>',
        body=body,
    )

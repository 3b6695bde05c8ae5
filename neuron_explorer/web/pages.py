"""What a page is: an HTML shell (title, one JavaScript module, a tab) at a path, and the JSON
twin under /api/ that its script reads. Pages and the other JSON routes are declared as data in
web/routes and mounted by web/app.py; values put into a shell are escaped here."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from string import Template
from typing import Any

TEMPLATES = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class Shell:
    """The HTML of a page: its title, the module under /static/js/ that draws it, whether it
    loads plotly.js first, and its label in a profile's tab bar (None: not a tab)."""

    title: str
    script: str
    plotly: bool = False
    tab: str | None = None


@dataclass(frozen=True)
class Page:
    """One page, registered once: the HTML shell at `path` and its JSON twin, `twin(service,
    **params)`, at `api` ("/api" + path unless given). `kind` names the shell in the HTML (the
    script reads it) and the tab it lights up; two pages may share a kind (a file of Source)."""

    kind: str
    path: str
    twin: Callable[..., Any]
    shell: Shell
    api: str = ""

    @property
    def api_path(self) -> str:
        return self.api or "/api" + self.path


@dataclass(frozen=True)
class Api:
    """A JSON (or download) route that is not a page of its own: `endpoint(service, **params)`
    at `path`, read by the page of kind `page` (docs/web.md lists it under that page)."""

    path: str
    endpoint: Callable[..., Any]
    page: str


ERROR = Shell("Error", "common.js")


@cache
def _template() -> Template:
    return Template((TEMPLATES / "page.html").read_text(encoding="utf-8"))


def _tabs(pages: Sequence[Page], kind: str, profile: str, hidden: Sequence[str] = ()) -> str:
    if not profile:
        return ""
    base = f"/p/{html.escape(profile)}"
    links, seen = [], set()
    for page in pages:
        if page.kind in hidden and page.kind != kind:
            continue
        if page.shell.tab and page.kind not in seen:  # one tab per kind (Source and its files)
            seen.add(page.kind)
            href = base if page.kind == "summary" else f"{base}/{page.kind}"
            cls = ' class="active"' if page.kind == kind else ""
            links.append(f'<a href="{href}"{cls}>{page.shell.tab}</a>')
    return "".join(links)


def render_page(
    kind: str,
    shell: Shell,
    *,
    title: str,
    pages: Sequence[Page] = (),
    profile: str = "",
    error: str = "",
    file_id: str = "",
    hidden_tabs: Sequence[str] = (),
    banner: str = "",
) -> str:
    """The HTML shell of a page (with the tab bar of `pages` when it shows a profile, less the
    kinds in `hidden_tabs`); `error` renders an error page instead of a script; `banner`, a
    line above the page (what an excerpt's analysis covers)."""
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
        tabs=_tabs(pages, kind, profile, hidden_tabs),
        plotly='<script src="/static/plotly.min.js"></script>' if shell.plotly else "",
        script=""
        if error
        else f'<script type="module" src="/static/js/{shell.script}"></script>'
        '<script type="module" src="/static/js/keys.js"></script>',  # every page's keys
        body=body,
        banner=f'<p class="scope-banner" role="note">{html.escape(banner)}</p>\n' if banner else "",
    )


def render_error(message: str) -> str:
    """The error page (no profile, no tabs) that every failed non-API request gets."""
    return render_page("error", ERROR, title="Error", error=message)

"""The FastAPI app, assembled: a `Service` holds the profiles and what is derived from them, and
each page of web/routes is mounted once, as its HTML shell at PATH and its JSON twin at
/api/PATH (plus the JSON routes that are not pages). Routes compute nothing themselves."""

from __future__ import annotations

import html
import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

from .guard import Guard
from .pages import Page, render_page
from .responses import READ_ERRORS, clip_strings, install_error_handlers, unreadable
from .routes import API, PAGES, WHOLE_PROFILE
from .service import Service

STATIC = Path(__file__).resolve().parent / "static"


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def create_app(
    root: str | Path,
    allowed_hosts: list[str] | None = None,
    analysis_cache: str | Path | None = None,
    max_memory: int | None = None,
) -> FastAPI:
    """The app serving the profile (or directory of profiles) at `root`. `allowed_hosts` limits
    the Host header (serve sets it on loopback, so a DNS-rebinding page cannot read profiles).
    Analysis results persist under `analysis_cache` (default: the user cache, web/cache.py);
    `max_memory` is the server's memory ceiling in bytes (default: web/memory.py)."""
    service = Service(root, analysis_cache, max_memory)
    # no /api/docs: Swagger UI would load scripts from a CDN into the origin that serves source
    app = FastAPI(title="Neuron Explorer", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json")  # fmt: skip
    app.state.service = service
    app.state.store = service.store
    app.state.sql_gate = service.gate
    app.state.warm_up = service.warm_up
    if allowed_hosts:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    app.add_middleware(Guard)
    install_error_handlers(app)

    for page in PAGES:
        _add_json(app, page.api_path, _scoped(page.twin, page.kind, service), service)
    for api in API:
        _add_json(app, api.path, _scoped(api.endpoint, api.page, service), service)

    @app.get("/static/plotly.min.js")
    def plotly_js() -> FileResponse:
        return FileResponse(_plotly_js(), media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=86400"})  # fmt: skip

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    for page in PAGES:
        app.add_api_route(page.path, _html_route(page, service), response_class=HTMLResponse,
                          methods=["GET"], name=_page_name(page))  # fmt: skip
    return app


def _scoped(endpoint: Callable[..., Any], kind: str, service: Service) -> Callable[..., Any]:
    """`endpoint` reading the profile its page analyses: the one place an analysis page of a
    profile too large to analyse whole is given its excerpt instead (Service.analysed), and
    its answer says so in `scope`; the pages of WHOLE_PROFILE read the profile named."""
    if kind in WHOLE_PROFILE or inspect.iscoroutinefunction(endpoint):
        return endpoint
    names = [p for p in ("name", "a", "b") if p in inspect.signature(endpoint).parameters]
    if not names:
        return endpoint

    def scoped(svc: Service, **params: Any) -> Any:
        given = {p: params[p] for p in names if isinstance(params.get(p), str)}
        read = {p: svc.analysed(v) for p, v in given.items()}
        out = endpoint(svc, **{**params, **read})
        # an excerpt read, or a stale stored analysis served (Service._stored)
        cut = {p: s for p, v in read.items() if (s := svc.scope(v)) is not None}
        if isinstance(out, dict) and cut:
            out = _named(out, {read[p]: given[p] for p in read})
            for p, scope in cut.items():  # compare's two sides: scope_a, scope_b
                out["scope" if p == "name" else f"scope_{p}"] = scope
        return out

    scoped.__signature__ = inspect.signature(endpoint)  # type: ignore[attr-defined]
    scoped.__name__ = endpoint.__name__
    scoped.__annotations__ = endpoint.__annotations__
    scoped.__module__ = endpoint.__module__
    scoped.__wrapped__ = endpoint  # type: ignore[attr-defined]
    return scoped


def _named(out: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """An answer computed on excerpts with their profiles' names where it names them."""
    out = dict(out)
    for key in ("name", "a", "b"):
        if isinstance(out.get(key), str) and out[key] in names:
            out[key] = names[out[key]]
    return out


def _add_json(app: FastAPI, path: str, endpoint: Callable[..., Any], service: Service) -> None:
    """Mount `endpoint(service, **params)` at `path`: FastAPI reads the parameters after the
    service from the function's own signature (queries, their bounds and defaults)."""
    # every answer is clipped (a 20 MB op name in a file is not sent whole), and none starts
    # while the server is past its memory ceiling
    bound: Any
    if inspect.iscoroutinefunction(endpoint):

        async def bound(**params: Any) -> Any:
            service.refuse_if_over_memory()
            try:
                return clip_strings(await endpoint(service, **params))
            except READ_ERRORS as e:
                raise unreadable(service, params.get("name"), e) from e
    else:

        def bound(**params: Any) -> Any:
            service.refuse_if_over_memory()
            try:
                return clip_strings(endpoint(service, **params))
            except READ_ERRORS as e:
                raise unreadable(service, params.get("name"), e) from e

    bound.func = endpoint  # the twin, as a partial names it
    bound.__signature__ = _resolved_signature(endpoint)
    app.add_api_route(path, bound, methods=["GET"], name=endpoint.__name__)


def _resolved_signature(endpoint: Callable[..., Any]) -> inspect.Signature:
    """The endpoint's signature after its first parameter (the service), with every annotation
    evaluated: route modules name `Service` only for type checkers, and FastAPI, failing to
    evaluate one annotation, would leave all of them unresolved (the response model and the
    OpenAPI document need them)."""
    hints = typing.get_type_hints(endpoint, localns={"Service": Service}, include_extras=True)
    sig = inspect.signature(endpoint)
    params = [p.replace(annotation=hints.get(p.name, p.annotation))
              for p in list(sig.parameters.values())[1:]]  # fmt: skip
    return sig.replace(parameters=params, return_annotation=hints.get("return", sig.empty))


def _html_route(page: Page, service: Service) -> Callable[..., HTMLResponse]:
    """The route of one page's HTML shell, taking the path's parameters by name."""
    params = re.findall(r"{(\w+)}", page.path)

    def route(**values: str) -> HTMLResponse:
        name = values.pop("name", None)
        hidden: tuple[str, ...] = ()
        banner = ""
        if name is not None:
            # a 404 page for unknown names, an error page for a corrupt profile
            p = service.store.open(name)
            if len(p.manifest.ranks) < 2:
                hidden = ("ranks",)  # one rank: nothing to set side by side
            if page.kind not in WHOLE_PROFILE:
                scope = service.scope(service.analysed(name))
                banner = scope["line"] if scope else ""
        title = f"{page.shell.title} · {name}" if name else page.shell.title
        extra = {k: html.escape(v) for k, v in values.items()}  # file_id, as the script reads it
        return HTMLResponse(render_page(page.kind, page.shell, title=title, pages=PAGES,
                                        profile=name or "", hidden_tabs=hidden, banner=banner,
                                        **extra))  # fmt: skip

    kw = inspect.Parameter.KEYWORD_ONLY
    route.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p, kw, annotation=str) for p in params],
        return_annotation=HTMLResponse,
    )
    route.__name__ = _page_name(page)
    return route


def _page_name(page: Page) -> str:
    return "page_" + page.twin.__name__.removeprefix("api_")

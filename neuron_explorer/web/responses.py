"""How errors become responses (a JSON `{"error": ...}` under /api/, an error page elsewhere),
and download headers that survive any profile name."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from neuron_explorer.errors import BadInputError, ExplorerError, private

from .pages import render_error
from .store import NotFound
from .views import sql


def install_error_handlers(app: FastAPI) -> None:
    """404 for what a URL names but does not exist, 400 for a refused query, 422 for a bad
    parameter (one sentence), 503 when SQL is saturated, 500 for the rest (one failed request,
    never a crash)."""

    @app.exception_handler(ExplorerError)
    def _explorer_error(request: Request, exc: ExplorerError) -> Response:
        status = (
            404 if isinstance(exc, NotFound) else 400 if isinstance(exc, sql.QueryError) else 500
        )
        if isinstance(exc, BadInputError):
            status = 500
        if isinstance(exc, sql.Busy):
            status = 503
        msg = _shown(request, str(exc))
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": msg}, status_code=status)
        return HTMLResponse(render_error(msg), status_code=status)

    @app.exception_handler(RequestValidationError)
    def _invalid(request: Request, exc: RequestValidationError) -> Response:
        # one readable sentence (the page shows `error`), plus FastAPI's own `detail`
        msg = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'request'}: {e.get('msg')}"
                        for e in exc.errors()) or "invalid request"  # fmt: skip
        if request.url.path.startswith("/api/"):
            return JSONResponse(
                {"error": msg, "detail": jsonable_encoder(exc.errors())}, status_code=422
            )
        return HTMLResponse(render_error(msg), status_code=422)

    @app.exception_handler(Exception)
    def _unexpected(request: Request, exc: Exception) -> Response:
        # a table that turns out unreadable mid-query, or a bug: one failed request, not a crash
        msg = f"{exc.__class__.__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        msg = _shown(request, msg)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": msg}, status_code=500)
        return HTMLResponse(render_error(msg), status_code=500)


def _shown(request: Request, msg: str) -> str:
    """No path of the server's machine in an error (the served folder, the home folder)."""
    store = getattr(request.app.state, "store", None)
    return store.shown(msg) if store is not None else private(msg)


def attachment(filename: str) -> dict[str, str]:
    """A download header for any profile name: an ASCII fallback plus the UTF-8 name (RFC 6266)."""
    from urllib.parse import quote

    plain = "".join(c if c.isascii() and (c.isalnum() or c in "._+-") else "_" for c in filename)
    return {
        "Content-Disposition": f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename)}"
    }

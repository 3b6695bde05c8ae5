"""How errors become responses (a JSON `{"error": ...}` under /api/, an error page elsewhere),
and download headers that survive any profile name."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response

from neuron_explorer.errors import BadInputError, ExplorerError, private

from .memory import OverMemory
from .pages import render_error
from .store import NotFound
from .views import sql

# Strings longer than this are clipped in every JSON answer, with a marker saying how much was
# left out: real op, kernel and file names are under a few kB, a source line under one.
MAX_STRING_CHARS = 10_000
MAX_ERROR_CHARS = 2_000  # an error is one line, whatever the value it quotes


def clip_strings(doc: Any, limit: int = MAX_STRING_CHARS) -> Any:
    """`doc` with every string longer than `limit` clipped, marked "… [N more characters]"
    (walked iteratively; lists and dicts are rebuilt only where a string was clipped)."""
    if isinstance(doc, str):
        return (
            doc if len(doc) <= limit else f"{doc[:limit]}… [{len(doc) - limit:,} more characters]"
        )
    if isinstance(doc, dict):
        out = None
        for k, v in doc.items():
            if isinstance(v, (str, dict, list)):
                c = clip_strings(v, limit)
                if c is not v:
                    out = dict(doc) if out is None else out
                    out[k] = c
        return doc if out is None else out
    if isinstance(doc, list):
        kinds = set(map(type, doc))  # in C: a timeline window's columns are 30,000 values
        if not any(issubclass(k, (dict, list)) for k in kinds) and (
            str not in kinds or max(map(len, _strs(doc, kinds)), default=0) <= limit
        ):  # a column or a row of plain values: nothing to clip (most of any answer)
            return doc
        clipped = [clip_strings(v, limit) for v in doc]
        return doc if all(a is b for a, b in zip(clipped, doc, strict=True)) else clipped
    return doc


def encoded(doc: dict[str, Any], plain: tuple[str, ...] = ()) -> Response:
    """`doc` as every JSON answer is (clip_strings), encoded by msgspec in one call: a large
    document skips FastAPI's walk, validation and encoding. `plain`: keys whose values hold no
    strings (numbers only: a timeline's 128,898 steps cost the walk 130 ms), left unwalked."""
    import msgspec

    clipped = clip_strings({k: v for k, v in doc.items() if k not in plain})
    body = msgspec.json.encode({k: doc[k] if k in plain else clipped[k] for k in doc})
    return Response(body, media_type="application/json")


def _strs(doc: list[Any], kinds: set[type]) -> list[Any]:
    """The plain strings of `doc` (itself when it holds nothing else)."""
    return doc if kinds == {str} else [v for v in doc if type(v) is str]


# what reading a table can raise, from pyarrow or from DuckDB scanning it
READ_ERRORS = (OSError, pa.ArrowException, duckdb.Error)


def unreadable(service: Any, name: object, exc: Exception) -> Exception:
    """`exc` as the profile's error (422, naming it) when it is a table of profile `name`
    that could not be read (a corrupt data page behind a sound footer), else `exc` itself."""
    text = " ".join(str(exc).split())
    read = isinstance(exc, (OSError, pa.ArrowException)) or (
        isinstance(exc, duckdb.Error) and "reading the stream registered as" in text
    )
    if not read or not isinstance(name, str) or isinstance(exc, ExplorerError):
        return exc
    try:
        path = service.store.path(name)
    except ExplorerError:
        return exc
    if isinstance(exc, OSError) and exc.errno:  # a file gone or not ours to read, mid-request
        return BadInputError(path, f"cannot read a table ({exc.strerror or text})")
    m = re.search(r"registered as '(\w+)' failed: (?:IOError: )?(.*)", text)
    table, detail = (f" {m.group(1)}", m.group(2)) if m else ("", text)
    return BadInputError(path, f"corrupt Parquet table{table} ({detail})")


def status_of(exc: BaseException) -> int:
    """404 for what a URL names but does not exist, 400 for a refused query, 422 for a profile
    that cannot be read or analysed (its error names the file and the problem), 503 when SQL
    is saturated or the server is at its memory ceiling, 500 for a bug."""
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, sql.QueryError):
        return 400
    if isinstance(exc, (sql.Busy, OverMemory, MemoryError, duckdb.OutOfMemoryException)):
        return 503
    if isinstance(exc, ExplorerError):
        return 422
    return 500


def error_message(exc: BaseException) -> str:
    """One line, at most MAX_ERROR_CHARS: an ExplorerError's own, else the exception's class and
    first line."""
    if isinstance(exc, ExplorerError):
        msg = str(exc)
    elif isinstance(exc, MemoryError):
        msg = "out of memory for this request; the server goes on serving"
    elif isinstance(exc, duckdb.OutOfMemoryException):  # its queries' share of --max-memory
        msg = (
            "this request needs more memory than the server's queries may hold (a quarter "
            "of --max-memory): refused; ask for less (a shorter span, a narrower query) or "
            "serve with a higher --max-memory; the server goes on serving"
        )
    else:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        msg = f"{exc.__class__.__name__}: {first}"
    msg = " ".join(msg.split())
    return msg if len(msg) <= MAX_ERROR_CHARS else msg[:MAX_ERROR_CHARS] + "…"


def shown_by(app: Any) -> Callable[[str], str]:
    """What a visitor may read of an error: no path of the server's machine (the served folder
    by its names in it, the home folder as `~`: web/store.py's `shown`)."""
    store = getattr(getattr(app, "state", None), "store", None)
    return store.shown if store is not None else private


def error_response(
    path: str, exc: BaseException, shown: Callable[[str], str] = private
) -> Response:
    """A JSON `{"error": ...}` under /api/, an error page elsewhere."""
    status, msg = status_of(exc), shown(error_message(exc))
    if path.startswith("/api/"):
        return JSONResponse({"error": msg}, status_code=status)
    return HTMLResponse(render_error(msg), status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    """Errors as responses (status_of); an exception no handler takes is answered by the Guard
    (web/guard.py), which keeps the connection open."""

    @app.exception_handler(ExplorerError)
    def _explorer_error(request: Request, exc: ExplorerError) -> Response:
        return error_response(request.url.path, exc, shown_by(request.app))

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


def attachment(filename: str) -> dict[str, str]:
    """A download header for any profile name: an ASCII fallback plus the UTF-8 name (RFC 6266)."""
    from urllib.parse import quote

    plain = "".join(c if c.isascii() and (c.isalnum() or c in "._+-") else "_" for c in filename)
    return {
        "Content-Disposition": f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename)}"
    }

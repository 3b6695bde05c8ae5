"""The web's /api/ JSON twins, called in-process: an agent's tool gets exactly the document the
web UI reads, through the same route, name checks, caches and limits, with no socket opened."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

from neuron_explorer.errors import ExplorerError

_FILE_ID = re.compile(r"^[0-9a-f]{12}$")


class Refused(ExplorerError):
    """The request names something the server does not serve, or the API turned it down."""


class Api:
    """The FastAPI app of `neuron-explorer serve` over `root`, answering GET requests in-process."""

    def __init__(self, root: str | Path, analysis_cache: str | Path | None = None) -> None:
        from neuron_explorer.web.app import create_app

        self.app = create_app(root, analysis_cache=analysis_cache)
        self.app.state.service.memory.watch()  # the server's memory ceiling, as serve's
        self.store = self.app.state.store

    def profile(self, name: object) -> str:
        """`name` if it is a served profile; Refused otherwise, by the web's own check (the
        store refuses `..`, slashes, absolute paths and symlinks out of the served folder)."""
        if not isinstance(name, str):
            raise Refused("a profile name must be a string; list_profiles gives the names")
        try:
            self.store.path(name)
        except ExplorerError as e:
            raise Refused(f"{e}; list_profiles gives the names") from None
        return name

    @staticmethod
    def file_id(file: str) -> str:
        """A source file as the web names it: its 12-hex id, or the id of the path given."""
        from neuron_explorer.web.views.source import file_id

        return file if _FILE_ID.match(file) else file_id(file)

    async def get(self, path: str, **params: Any) -> dict[str, Any]:
        """The JSON document at /api/`path` (segments already quoted); Refused with the API's
        own message for any 4xx or 5xx answer."""
        query = urlencode({k: v for k, v in params.items() if v is not None})
        status, body = await _call(self.app, "/api/" + path, query)
        try:
            doc = json.loads(body) if body else {}
        except ValueError:
            raise Refused(f"/api/{path}: HTTP {status}, not JSON") from None
        if status >= 400:
            raise Refused(_error_text(doc, status))
        return doc


def segment(text: str) -> str:
    """One URL path segment (a name can never reach another route)."""
    return quote(text, safe="")


def _error_text(doc: Any, status: int) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return doc["error"]
    if isinstance(doc, dict) and isinstance(doc.get("detail"), list):  # FastAPI's validation
        return "; ".join(
            f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg')}" for d in doc["detail"]
        )
    return f"HTTP {status}"


async def _call(app: Any, path: str, query: str) -> tuple[int, bytes]:
    """One GET through the ASGI interface (the app runs its sync routes in worker threads);
    `path` is percent-encoded, and ASGI's `path` is the decoded one the router reads."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": unquote(path), "raw_path": path.encode(), "root_path": "",
        "query_string": query.encode(), "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    import anyio

    status, chunks, sent, done = 500, [], False, anyio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()  # the client "disconnects" only once the whole answer is in
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    await app(scope, receive, send)
    return status, b"".join(chunks)

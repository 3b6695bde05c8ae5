"""What every response passes through: cross-site API requests refused, security headers sent,
HEAD answered as GET without a body; and the uvicorn protocol that drops idle connections."""

from __future__ import annotations

import json
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from .responses import error_response, shown_by, status_of

log = logging.getLogger("uvicorn.error")

# Nothing is loaded from outside the server; plotly sets inline styles, nothing else is inline.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
# A browser says where a request comes from in Sec-Fetch-Site; scripts and agents send none.
SAME_SITE = (b"same-origin", b"none")
# A connection that has sent no complete request this long after opening (or after its last
# answer) is closed: idle sockets and slowly dripped headers cannot pile up.
IDLE_S = 15.0


class Guard:
    """ASGI middleware: refuses /api/ requests that a browser marks as coming from another site
    (Sec-Fetch-Site) or whose Origin is not the server's own (403), so a page elsewhere cannot
    run queries on a local server; adds CSP and frame protection to every response; serves HEAD
    for every GET route."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["path"].startswith("/api/") and not _same_origin(headers, scope):
            await _refuse(send)
            return
        head = scope["method"] == "HEAD"
        if head:
            scope = {**scope, "method": "GET"}
        started = False

        async def guarded_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()), *HEADERS]}
            elif head and message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        try:
            await self.app(scope, receive, guarded_send)
        except Exception as exc:
            # answered here rather than by Starlette's last-resort handler, which re-raises
            # into uvicorn, and uvicorn then drops the keep-alive connection with the answer
            if started:
                raise
            if status_of(exc) == 500:
                log.error("%s %s failed", scope["method"], scope["path"], exc_info=exc)
            await error_response(scope["path"], exc, shown_by(scope.get("app")))(
                scope, receive, guarded_send
            )


def _same_origin(headers: dict[bytes, bytes], scope: dict) -> bool:
    site = headers.get(b"sec-fetch-site")
    if site is not None and site not in SAME_SITE:
        return False
    origin = headers.get(b"origin")
    if origin is None:
        return True
    host = headers.get(b"host", b"").decode("latin-1")
    return origin.decode("latin-1") == f"{scope.get('scheme', 'http')}://{host}"


async def _refuse(send: Any) -> None:
    body = json.dumps({"error": "cross-site request refused: the API answers only pages of "
                                "this server (Origin / Sec-Fetch-Site)"}).encode()  # fmt: skip
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *HEADERS]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class IdleTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for each request to arrive: uvicorn times out
    keep-alive connections only after a first answer, so a socket that never sends a full
    request would stay open for ever."""

    _deadline = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(IDLE_S, self._drop_if_idle)

    def _drop_if_idle(self) -> None:
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and not self.transport.is_closing():
            self.transport.close()

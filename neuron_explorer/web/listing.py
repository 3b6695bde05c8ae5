"""The profile list, robust: each profile's row is built on a worker thread with a time bound,
so a profile that cannot be read (any error, not only ours) or that hangs (a stuck mount) costs
only its own row, never the list."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import Any

ROW_S = 5.0  # the longest the list waits for one profile's row
AGAIN_S = 0.05  # for a row still being built since an earlier request


class ProfileList:
    """Builds rows with `make_row(name) -> dict`; a row still being built from an earlier
    request is waited for again, never started twice. Each row gets a thread of its own, so a
    hung profile holds one thread and delays the list by at most ROW_S, once."""

    def __init__(self) -> None:
        self._running: dict[str, Future] = {}
        self._lock = threading.Lock()

    def rows(
        self, names: list[str], make_row: Callable[[str], dict[str, Any]], row_s: float = ROW_S
    ) -> list[dict[str, Any]]:
        """One row per name, built in order (so the first profiles get the inline analysis
        budget, as before), each waited for at most `row_s`; a row still running from an
        earlier request (a hung profile) is waited for only briefly. A failed profile's row is
        {name, error}; a row not built yet is {name, error: None, reading_s}: a slow profile
        is only slow (the page says "still reading" and asks again), and a hung one costs only
        its row."""
        out = []
        for name in names:
            with self._lock:
                f = self._running.get(name)
                again = f is not None
                if f is None:
                    f = self._running[name] = self._start(name, make_row)
            wait([f], timeout=AGAIN_S if again else row_s)
            out.append(self._row(name, f, row_s))
        return out

    def _start(self, name: str, make_row: Callable[[str], dict[str, Any]]) -> Future:
        future: Future = Future()
        future.started = time.monotonic()  # type: ignore[attr-defined]

        def build() -> None:
            try:
                future.set_result(make_row(name))
            except BaseException as e:  # noqa: BLE001 - any failure is this row's error
                future.set_exception(e)
            finally:
                with self._lock:
                    self._running.pop(name, None)

        threading.Thread(target=build, daemon=True, name=f"list-{name[:20]}").start()
        return future

    @staticmethod
    def _row(name: str, f: Future, row_s: float) -> dict[str, Any]:
        if not f.done():
            waited = time.monotonic() - getattr(f, "started", time.monotonic())
            return {"name": name, "error": None, "reading_s": round(max(waited, row_s), 1)}
        exc = f.exception()
        if exc is None:
            return f.result()
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"name": name, "error": text or exc.__class__.__name__}

"""The import's progress on the terminal: bytes read, events decoded, rate and time left on one
line redrawn in place; when stderr is not a terminal (piped, logged), one line at the end."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TextIO

REDRAW_S = 0.1  # a terminal line redrawn at most this often
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'2G', '512M', '1.5GiB', '1000000' -> bytes (ValueError naming the text otherwise)."""
    m = _SIZE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"not a size: {text!r} (expected a number of bytes, or 512M, 2G...)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover - the loop returns at GB


def human_seconds(s: float) -> str:
    s = max(0, round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class ImportProgress:
    """A Progress (importers.progress) that writes to `out`: redrawn on a terminal, one line
    at `close` otherwise."""

    def __init__(
        self,
        out: TextIO,
        total_bytes: int,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out, self.total = out, max(1, total_bytes)
        self.tty = out.isatty() if tty is None else tty
        self.clock = clock
        self.start = clock()
        self.stage, self.fraction, self.events, self.read = "starting", 0.0, 0, 0
        self._drawn_at = -REDRAW_S
        self._width = 0

    def __call__(
        self,
        stage: str,
        fraction: float,
        events: int | None = None,
        bytes_read: int | None = None,
    ) -> None:
        self.stage, self.fraction = stage, min(1.0, max(self.fraction, fraction))
        if events is not None:
            self.events = events
        if bytes_read is not None:
            self.read = max(self.read, bytes_read)
        now = self.clock()
        if self.tty and now - self._drawn_at >= REDRAW_S:
            self._drawn_at = now
            self._draw(self.line(now))

    def line(self, now: float) -> str:
        """The progress line: stage, bytes, events, rate, time left."""
        elapsed = max(now - self.start, 1e-9)
        done = self.read
        parts = [
            self.stage,
            f"{human_bytes(done)} / {human_bytes(self.total)}",
            f"{self.events:,} events",
            f"{human_bytes(done / elapsed)}/s",
        ]
        if 0 < self.fraction < 1:
            parts.append(f"{human_seconds(elapsed * (1 - self.fraction) / self.fraction)} left")
        return "  ".join(parts)

    def _draw(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self.out.write("\r" + text + " " * pad)
        self.out.flush()
        self._width = len(text)

    def close(self, ok: bool = True) -> None:
        """Clear the terminal line; piped, write the one line (only for an import that
        finished)."""
        if self.tty:
            if self._width:
                self._draw("")
                self.out.write("\r")
                self.out.flush()
            return
        if ok:
            elapsed = max(self.clock() - self.start, 1e-9)
            self.out.write(
                f"read {human_bytes(self.total)}, {self.events:,} events in {elapsed:.1f} s "
                f"({human_bytes(self.total / elapsed)}/s)\n"
            )
            self.out.flush()

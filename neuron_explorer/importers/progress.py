"""What an import tells its caller as it goes: the stage, the share of the work done and, while
files are read as streams, how many events have been decoded."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """progress(stage, fraction done in [0, 1], events decoded so far, bytes of the files read
    so far; the last two None when not known)."""

    def __call__(
        self,
        stage: str,
        fraction: float,
        events: int | None = None,
        bytes_read: int | None = None,
    ) -> None: ...


class Share(Protocol):
    """A file's own progress: the share of it done, and its events decoded so far."""

    def __call__(self, fraction: float, events: int | None = None) -> None: ...


def no_share(fraction: float, events: int | None = None) -> None:
    """A Share that reports nothing."""

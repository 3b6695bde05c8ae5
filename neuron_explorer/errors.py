"""Errors a user can act on. The CLI prints them as one line and exits with status 2."""

from __future__ import annotations

from pathlib import Path


class ExplorerError(Exception):
    """An error with a message fit for one line of terminal output."""


class BadInputError(ExplorerError):
    """An input file (trace or profile) cannot be read; the message names the file."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def private(text: str) -> str:
    """`text` with the user's home folder shown as `~`: messages a server sends (a DuckDB
    error, a path in a served folder) must not tell a visitor who runs it or where."""
    import re

    home = str(Path.home()).rstrip("/")
    return re.sub(re.escape(home) + r"(?![\w.-])", "~", text) if len(home) > 1 else text

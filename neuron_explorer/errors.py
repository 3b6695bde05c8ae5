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

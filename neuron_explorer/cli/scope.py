"""The profile an analysis command reads: the profile itself, or the excerpt the import cut
from one too big to analyse whole (analysis/scoped.py), after a line saying what it covers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..model.profile import Profile


def open_analysed(path: str | Path, json_out: bool = False) -> Profile:
    """Open `path` for an analysis command; an excerpt's scope line is printed first (on
    stderr under --json, so stdout stays one JSON document)."""
    from ..analysis.scoped import analysed, scope_line, scope_of
    from ..model.profile import Profile

    profile = analysed(Profile.open(path))
    line = scope_line(scope_of(profile))
    if line:
        print(f"{line}; timeline, find and SQL read the whole profile",
              file=sys.stderr if json_out else sys.stdout)  # fmt: skip
    return profile

"""Which source files a capture keeps in sources/: the same rules as an import
(importers/sources.py), with the run's working and script directories and the installed
packages' directories as the roots."""

from __future__ import annotations

from ..importers.sources import (
    MAX_SOURCE_BYTES,
    MAX_TOTAL_SOURCE_BYTES,
    Selection,
    library_roots,
    named_files,
    readable,
    select,
)

__all__ = [
    "MAX_SOURCE_BYTES", "MAX_TOTAL_SOURCE_BYTES", "Selection", "library_roots", "named_files",
    "readable", "select",
]  # fmt: skip

"""Which source files a profile keeps in sources/, so its source view works on any machine.

Kept: the Python files (`.py`) named by the profile's frames of user or library code (the
user's script, a model library's modeling files), found under the allowed roots, at most
MAX_SOURCE_BYTES each and MAX_TOTAL_SOURCE_BYTES in all. Never kept: anything that resolves
outside every root (absolute paths elsewhere, `..`, symlinks out), anything not a Python source,
torch's and the standard library's files. A trace is untrusted input: its frame names choose
the files, so the roots are what the user's run could have executed (docs/format.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

MAX_SOURCE_BYTES = 1 << 20
MAX_TOTAL_SOURCE_BYTES = 32 << 20
MAX_SKIPPED_LISTED = 200  # the manifest lists this many skipped files, then counts the rest
KEPT_SCOPES = ("user", "library")
PYTHON_SUFFIX = ".py"


@dataclass
class Selection:
    """The files kept (name as the profile names it, text) and those skipped, with why."""

    kept: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def manifest_extra(self) -> dict:
        listed = [{"file": f, "reason": r} for f, r in self.skipped[:MAX_SKIPPED_LISTED]]
        return {"sources_skipped": listed, "sources_skipped_count": len(self.skipped)}


def named_files(events: pa.Table, stacks: pa.Table) -> list[str]:
    """Distinct files of user and library code named by events (src_file, model_file) and by
    the stacks' frames."""
    names: set[str] = set()
    for name in ("src_file", "model_file"):
        if name in events.column_names and len(events):
            names.update(_distinct(events.column(name)))
    if stacks.num_rows:
        scope = stacks.column("scope") if "scope" in stacks.column_names else None
        files = stacks.column("file")
        if scope is not None:
            keep = pc.fill_null(pc.is_in(pc.cast(scope, pa.string()), pa.array(KEPT_SCOPES)), True)
            files = pc.filter(files, keep)
        names.update(_distinct(files))
    return sorted(names)


def _distinct(col) -> list[str]:
    return [x for x in pc.unique(pc.cast(col, pa.string())).to_pylist() if x]


def library_roots() -> list[str]:
    """The installed-package directories on sys.path (site-packages, dist-packages)."""
    return [p for p in sys.path if p and Path(p).name in ("site-packages", "dist-packages")]


def select(files: Iterable[str], roots: Sequence[str | os.PathLike]) -> Selection:
    """Pick the files to keep: Python sources under a root, small enough (module docstring)."""
    real_roots = [Path(os.path.realpath(r)) for r in roots if r]
    out, total = Selection(), 0
    for name in files:
        path, why = _resolve(name, real_roots)
        if path is None:
            out.skipped.append((name, why))
            continue
        try:
            size = path.stat().st_size
            if size > MAX_SOURCE_BYTES or total + size > MAX_TOTAL_SOURCE_BYTES:
                out.skipped.append((name, "too large"))
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            out.skipped.append((name, "unreadable"))
            continue
        total += size
        out.kept.append((name, text))
    return out


def _resolve(name: str, roots: list[Path]) -> tuple[Path | None, str]:
    """The real file for a frame's path, only if it lies under a root; else why not."""
    if not name.endswith(PYTHON_SUFFIX) or "\0" in name:
        return None, "not a Python source"
    p = Path(name)
    candidates = [p] if p.is_absolute() else [r / p for r in roots]
    outside = False
    for c in candidates:
        real = Path(os.path.realpath(c))
        if not any(real.is_relative_to(r) for r in roots):
            outside = True
            continue
        if real.is_file():
            return real, ""
    return None, "outside the source roots" if outside else "not found"


def readable(files: Iterable[str], roots: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(name, text) of each file `select` keeps."""
    yield from select(files, list(roots)).kept

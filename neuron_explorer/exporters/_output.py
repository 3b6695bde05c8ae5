"""Atomic output for exporters: write under a temporary sibling name, then rename, so an
interrupted export never leaves a file or directory that looks finished."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ExplorerError


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _overlaps(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


@contextmanager
def atomic_output(out: Path, *, force: bool, keep_clear_of: Path) -> Iterator[Path]:
    """Yield a temporary path beside `out` (same suffix, so formats can be told by name);
    on success rename it to `out`, replacing an existing `out` only when `force`."""
    if _overlaps(out, keep_clear_of):
        raise ExplorerError(
            f"{out}: output overlaps the profile directory; choose a path outside it"
        )
    if (out.exists() or out.is_symlink()) and not force:
        raise ExplorerError(f"{out}: output exists; use --force to replace it")
    for parent in (out.parent, *out.parent.parents):
        if parent.exists() and not parent.is_dir():
            raise ExplorerError(f"{out}: cannot write there, {parent} is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(4)
    tmp = out.parent / f".tmp-{token}-{out.name}"
    try:
        yield tmp
        if out.exists() or out.is_symlink():
            old = out.parent / f".old-{token}-{out.name}"
            os.replace(out, old)
            os.replace(tmp, out)
            _remove(old)
        else:
            os.replace(tmp, out)
    finally:
        _remove(tmp)

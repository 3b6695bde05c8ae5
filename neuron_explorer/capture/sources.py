"""Which user source files a profile keeps in sources/: those named by its events and stacks,
when they are regular files under the script's directory or the working directory."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

MAX_SOURCE_BYTES = 1 << 20
_PREFIX = Path(os.path.realpath(sys.prefix))


def named_files(events: pa.Table, stacks: pa.Table) -> list[str]:
    """Distinct file names in events.src_file and stacks.file."""
    names: set[str] = set()
    for col in (events.column("src_file"), stacks.column("file")):
        if len(col):
            names.update(x for x in pc.unique(pc.cast(col, pa.string())).to_pylist() if x)
    return sorted(names)


def _under(path: Path, roots: Iterable[Path]) -> bool:
    if "site-packages" in path.parts or path.is_relative_to(_PREFIX):
        return False  # libraries (a venv inside the working directory) are not user code
    return any(path.is_relative_to(r) for r in roots)


def readable(files: Iterable[str], roots: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(name, text) of each file that is a regular UTF-8 file of at most 1 MiB under a root."""
    real_roots = [Path(os.path.realpath(r)) for r in roots]
    for name in files:
        path = Path(os.path.realpath(name))
        if not _under(path, real_roots) or not path.is_file():
            continue
        try:
            if path.stat().st_size > MAX_SOURCE_BYTES:
                continue
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield name, text

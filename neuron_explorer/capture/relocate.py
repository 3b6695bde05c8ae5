"""Make a profile's file paths relative, so a profile committed to a repository names
`samples/models.py`, never the absolute path of the machine that captured it.

A file of an installed package becomes relative to its site-packages directory, as
torch.profiler trims its python events (`torch/nn/modules/module.py`), even when the venv sits
in `root`; any other path under `root` becomes relative to it, and any other absolute path
relative to the longest `sys.path` entry it lies under; paths already relative stay. The kept sources move with them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..model.io import SOURCES, _write_table, source_relpath
from ..model.schema import EVENTS, STACKS
from ..model.schema import conform as _conform

PATH_COLUMNS = {EVENTS: ("src_file", "model_file"), STACKS: ("file",)}


def relative_name(file: str, root: Path, bases: list[Path]) -> str:
    """The name `file` gets (module docstring)."""
    p = Path(file)
    if not p.is_absolute():
        return file
    # an installed package by its import path (torch/nn/...), even when the venv sits in root
    libs = [b for b in bases if b.name in ("site-packages", "dist-packages")]
    for base in [*libs, root, *bases]:
        if p.is_relative_to(base):
            return p.relative_to(base).as_posix()
    return file


def relativize(profile: Path, root: Path) -> dict[str, str]:
    """Rewrite `profile` in place (events, stacks, sources/, the manifest's inputs and extra);
    returns the renames."""
    root = Path(os.path.realpath(root))
    bases = sorted(
        {Path(os.path.realpath(p)) for p in sys.path if p and Path(p).is_dir()},
        key=lambda b: -len(b.parts),
    )
    renames: dict[str, str] = {}

    def rename(name: str | None) -> str | None:
        if name is None:
            return None
        if name not in renames:
            renames[name] = relative_name(name, root, bases)
        return renames[name]

    for table, columns in PATH_COLUMNS.items():
        single = profile / table.file
        parts = [single] if single.exists() else sorted((profile / table.name).rglob("*.parquet"))
        for path in parts:
            data = pq.read_table(path)
            for col in (c for c in columns if c in data.column_names):
                values = pc.cast(data.column(col), pa.string()).to_pylist()
                new = pa.array([rename(v) for v in values], pa.string())
                data = data.set_column(data.schema.get_field_index(col), col, new)
            _write_table(table, _conform(table, data), path)
    _move_sources(profile / SOURCES, renames)
    manifest = profile / "manifest.json"
    text = manifest.read_text(encoding="utf-8")
    for old, new in sorted(renames.items(), key=lambda kv: -len(kv[0])):
        if old != new:
            text = text.replace(json.dumps(old)[1:-1], json.dumps(new)[1:-1])
    text = text.replace(json.dumps(str(root) + "/")[1:-1], "")  # the command's other paths
    manifest.write_text(text, encoding="utf-8")
    return renames


def _move_sources(sources: Path, renames: dict[str, str]) -> None:
    if not sources.is_dir():
        return
    moved = sources.with_name(SOURCES + ".new")
    for old, new in renames.items():
        src = sources / source_relpath(old)
        if src.is_file():
            dest = moved / source_relpath(new)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
    shutil.rmtree(sources)
    if moved.exists():
        moved.rename(sources)

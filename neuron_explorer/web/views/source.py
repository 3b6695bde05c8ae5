"""The source page's view: neuron_explorer.analysis.lines computes it; this module adds the
web-only decoration (a URL-safe `file_id` beside every file path, `with_file_ids`, the one
place it is added) and finds a file by that id. The other names are one-line adapters."""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa

from neuron_explorer.analysis import lines as _lines
from neuron_explorer.analysis.lines import (  # noqa: F401 - the routes' names
    line_table,
    model_line_table,
    read_source,
)
from neuron_explorer.model import Profile


def file_id(path: str) -> str:
    """A stable id for a source file path, safe in a URL."""
    return hashlib.sha1(path.encode("utf-8")).hexdigest()[:12]


def with_file_ids(doc: Any) -> Any:
    """`doc` with a `file_id` beside every non-empty string `file` in it (nested dicts, lists
    and tuples), so the pages link paths to the source view; changes `doc`'s dicts in place."""
    if isinstance(doc, dict):
        if isinstance(doc.get("file"), str) and doc["file"]:
            doc["file_id"] = file_id(doc["file"])
        for v in doc.values():
            if isinstance(v, (dict, list, tuple)):
                with_file_ids(v)
    elif isinstance(doc, (list, tuple)):
        for v in doc:
            with_file_ids(v)
    return doc


def find_file(lines: pa.Table, fid: str, model: pa.Table | None = None) -> str | None:
    names = set(lines.column("file").to_pylist())
    if model is not None:
        names.update(model.column("file").to_pylist())
    for f in names:
        if file_id(f) == fid:
            return f
    return None


def source_json(profile: Profile, lines: pa.Table, model: pa.Table, level: str) -> dict[str, Any]:
    """The source page: analysis.lines.source_page with file ids."""
    return with_file_ids(_lines.source_page(profile, lines, model, level).to_dict())


def files_json(lines: pa.Table, profile: Profile) -> list[dict[str, Any]]:
    return with_file_ids(_lines.files_of(lines, profile))


def top_lines(lines: pa.Table, n: int = 10) -> list[dict[str, Any]]:
    return with_file_ids(_lines.hot_lines(lines, n))


def model_files_json(model: pa.Table, profile: Profile) -> list[dict[str, Any]]:
    return with_file_ids(_lines.model_files(model, profile))


def top_model_lines(model: pa.Table, n: int = _lines.TOP_LINES) -> list[dict[str, Any]]:
    return with_file_ids(_lines.top_model_lines(model, n))


def file_json(
    profile: Profile,
    lines: pa.Table,
    path: str,
    modeled: bool,
    model: pa.Table | None = None,
    around: int | None = None,
    context: int = 50,
) -> dict[str, Any]:
    return with_file_ids(_lines.source_file(profile, lines, path, model, around, context).to_dict())


def line_detail(con, path: str, line: int) -> dict[str, Any]:
    return with_file_ids(_lines.line_detail(con, path, line).to_dict())

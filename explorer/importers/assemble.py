"""Put the mapped trace files (one per rank) together into one profile and write it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import BadInputError
from ..model.io import ProfileWriter
from ..model.manifest import Manifest, Step
from . import pystacks
from .kineto import FileData, PatchedText


def assign_ranks(files: Sequence[FileData]) -> list[int]:
    """distributedInfo.rank where a file has one; the others take the lowest free ranks in file
    order. Two files with the same rank are an error."""
    seen: dict[int, Path] = {}
    for f in files:
        if f.rank is not None:
            if f.rank in seen:
                raise BadInputError(f.path, f"rank {f.rank} is also the rank of {seen[f.rank]}")
            seen[f.rank] = f.path
    free = (r for r in range(len(files) + len(seen)) if r not in seen)
    return [f.rank if f.rank is not None else next(free) for f in files]


def _order(f: FileData) -> np.ndarray:
    """Rows in (start, longest first) order: the events table's order within a rank, so ids
    numbered in it follow the table's sort and the table needs no sort of its own."""
    return np.lexsort((-f.columns["dur_ns"], f.columns["start_ns"]))


def _permute(col: Any, order: np.ndarray, pos: np.ndarray) -> Any:
    """`col` in `order` (`pos`: each row's place in it)."""
    if isinstance(col, np.ndarray):
        return col[order]
    if isinstance(col, PatchedText):
        return _take_patched(col, order, pos)
    return col.take(order)


BLOCK_ROWS = 1 << 16


def _take_patched(col: PatchedText, order: np.ndarray, pos: np.ndarray) -> pa.ChunkedArray:
    """The patched text column in `order`, built block by block: each block taken from the
    base and patched on its own, so only the result and one block exist besides the base."""
    at = pos[col.rows]
    by_place = np.argsort(at, kind="stable")
    at, texts = at[by_place], col.texts.take(by_place)
    out = []
    for i in range(0, len(order), BLOCK_ROWS):
        block = col.base.take(order[i : i + BLOCK_ROWS])
        lo, hi = np.searchsorted(at, [i, i + BLOCK_ROWS])
        if hi > lo:
            mask = np.zeros(len(block), dtype=bool)
            mask[at[lo:hi] - i] = True
            block = pc.replace_with_mask(block, mask, texts.slice(lo, hi - lo))
        out.append(block)
    return pa.chunked_array(out, type=col.base.type)


def _link(ids: np.ndarray, rows: np.ndarray) -> pa.Array:
    """Row indices (-1: none) as the ids of those rows (null: none)."""
    return pa.array(np.where(rows >= 0, ids[np.clip(rows, 0, None)], 0), mask=rows < 0)


def _events(f: FileData, rank: int, first_id: int, first_stack: int, origin: int) -> pa.Table:
    """The file's events table in its final order; its columns are taken out of `f` one by
    one as they are reordered, so the file's columns and the table never coexist whole."""
    order = _order(f)
    n = len(order)
    pos = np.empty(n, dtype=np.int64)  # each row's place in the table
    pos[order] = np.arange(n, dtype=np.int64)
    ids = pos + first_id
    cols: dict[str, Any] = {
        "id": np.arange(first_id, first_id + n, dtype=np.int64),
        "rank": pa.array(np.full(n, rank, dtype=np.int32)),
        "parent_id": _link(ids, f.links["parent"][order]),
        "flow_id": _link(ids, f.links["flow_src"][order]),
    }
    for name in list(f.columns):
        col = _permute(f.columns.pop(name), order, pos)
        if name == "start_ns":
            col = col - origin
        elif name == "stack_id":
            col = pa.array(col + first_stack, mask=col < 0)
        cols[name] = col
    return pa.table(cols)


def write_profile(
    files: Sequence[FileData],
    out: Path,
    *,
    writer: ProfileWriter,
    source_roots: Sequence[Path] = (),
    progress: Callable[[float], None] | None = None,
) -> Path:
    """Shift every file to one origin, number events, write the three tables and sources."""
    report = progress or (lambda f: None)
    ranks = assign_ranks(files)
    origin = min(int(f.columns["start_ns"].min()) for f in files)
    events, stacks, counters, steps = [], [], [], []
    next_id, next_stack = 0, 0
    for rank, f in sorted(zip(ranks, files, strict=True), key=lambda x: x[0]):
        sid = f.columns["stack_id"]
        stack_count = int(sid.max()) + 1 if len(sid) and sid.max() >= 0 else 0
        events.append(_events(f, rank, next_id, next_stack, origin))
        next_id += events[-1].num_rows
        st = dict(f.stacks)
        st["stack_id"] = pa.array(st["stack_id"].to_numpy() + next_stack)
        stacks.append(pa.table(st))
        next_stack += stack_count
        c = dict(f.counters)
        c["ts_ns"] = c["ts_ns"] - origin
        c["rank"] = pa.array(np.full(len(c["ts_ns"]), rank, dtype=np.int32))
        c["unit"] = pa.array(["bytes"] * len(c["ts_ns"]), pa.string())
        counters.append(pa.table(c))
        steps += [Step(s, rank, start - origin, dur) for s, start, dur in f.steps]
    report(0.3)
    writer.write_events(_concat(events))
    report(0.8)
    writer.write_table("stacks", _concat(stacks))
    writer.write_table("counters", _concat(counters))
    _copy_sources(writer, files, source_roots)
    many = len(files) > 1
    devices = [
        {**d, "rank": r} if many else d
        for r, f in zip(ranks, files, strict=True)
        for d in f.devices
    ]
    manifest = Manifest(
        source="kineto",
        origin_unix_ns=origin,
        ranks=tuple(sorted(ranks)),
        devices=tuple(devices),
        host=str(files[0].meta.get("host_name", "")),
        steps=tuple(sorted(steps, key=lambda s: (s.rank, s.step, s.start_ns))),
        inputs=tuple(str(f.path) for f in files),
        extra={
            "kineto": [
                {"rank": r, "path": str(f.path), **f.meta}
                for r, f in zip(ranks, files, strict=True)
            ]
        },
    )
    path = writer.commit(manifest)
    report(1.0)
    return path


def _concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def _copy_sources(
    writer: ProfileWriter, files: Sequence[FileData], source_roots: Sequence[Path]
) -> None:
    """Keep the text of each user file named by a stack, found as written or under a root."""
    for f in files:
        roots = [*source_roots, Path.cwd(), *list(f.path.resolve().parents)[:3]]
        for name in sorted(f.user_files):
            found = pystacks.find_source(name, roots)
            if found is None:
                continue
            try:
                writer.add_source(name, found.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                continue

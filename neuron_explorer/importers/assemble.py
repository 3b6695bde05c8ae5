"""Put the mapped trace files (one per rank) together into one profile and write it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import BadInputError
from ..model.io import ROW_GROUP_ROWS, ProfileWriter
from ..model.manifest import Manifest, Step
from ..model.schema import COUNTERS, EVENTS, STACKS, conform, empty_table
from ..vocab.intervals import key_then_descending
from .kineto import FileData
from .kineto_columns import give_back_free_memory


def assign_ranks(files: Sequence[Any]) -> list[int]:
    """distributedInfo.rank where a file (with `rank` and `path`) has one; the others take the lowest free ranks in file
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
    """Rows in (start, longest first) order: the events table's order within a rank (ids are
    numbered in it, so the table is in (rank, start_ns, id) order as written)."""
    return key_then_descending(f.columns["start_ns"], f.columns["dur_ns"])


def _take(col: Any, rows: np.ndarray) -> Any:
    if isinstance(col, np.ndarray):
        return col[rows]
    return col.take(rows)


def _ids_of(ids: np.ndarray, rows: np.ndarray, first_id: int) -> np.ndarray:
    """Row indices (-1: none) as the ids of those rows (-1: none)."""
    return np.where(rows >= 0, ids[np.clip(rows, 0, None)] + np.int64(first_id), -1)


def _masked(ids: np.ndarray) -> pa.Array:
    return pa.array(ids, mask=ids < 0)


def _event_blocks(
    f: FileData, rank: int, first_id: int, first_stack: int, origin: int, *, trim: bool = True
) -> Iterator[dict[str, Any]]:
    """The file's events in their final order, a row group at a time: the reordered table
    never exists whole, and each block is written before the next is taken (`trim`: the freed
    heap given back after each, unless the caller keeps it for the next: kineto_heap)."""
    order = _order(f)
    small = len(order) < 2**31  # positions as int32: half the memory of the two arrays
    order = order.astype(np.int32) if small else order
    ids = np.empty(len(order), dtype=np.int32 if small else np.int64)
    ids[order] = np.arange(len(order), dtype=ids.dtype)  # the file's ids, less first_id
    for i in range(0, len(order), ROW_GROUP_ROWS):
        # yielded, not held here: the block is let go once written, not when the next is made
        yield _block(f, order[i : i + ROW_GROUP_ROWS], ids, rank, first_id, first_stack, origin)
        if trim:
            give_back_free_memory()  # the written block's smaller columns, freed on the heap


def _block(
    f: FileData,
    rows: np.ndarray,
    ids: np.ndarray,
    rank: int,
    first_id: int,
    first_stack: int,
    origin: int,
) -> dict[str, Any]:
    """The events table's columns of `rows` (positions in `f`), ids and times final."""
    block = {name: _take(col, rows) for name, col in f.columns.items()}
    block["id"] = ids[rows] + np.int64(first_id)
    block["rank"] = np.full(len(rows), rank, dtype=np.int32)
    block["parent_id"] = _masked(_ids_of(ids, f.links["parent"][rows], first_id))
    block["flow_id"] = _masked(_ids_of(ids, f.links["flow_src"][rows], first_id))
    block["start_ns"] = block["start_ns"] - origin
    sid = block["stack_id"]
    block["stack_id"] = pa.array(sid.astype(np.int64) + first_stack, mask=sid < 0)
    return block


@dataclass(frozen=True)
class Assembled:
    """The mapped files on one origin with their events numbered, before anything is written:
    what an import writes, and what capture merges in memory."""

    blocks: Iterator[dict[str, Any]]  # the events in final order, a row group at a time (once)
    stacks: pa.Table
    counters: pa.Table
    manifest: Manifest  # what the traces say; which sources were kept is the writer's to add

    def events(self) -> pa.Table:
        """The whole events table (consumes `blocks`)."""
        tables = [conform(EVENTS, b) for b in self.blocks]
        return pa.concat_tables(tables) if tables else EVENTS.arrow_schema().empty_table()


def assemble(files: Sequence[FileData], *, counters: bool = True) -> Assembled:
    """Shift every file to one origin, number events and stacks, and gather counters (without
    `counters`, an empty table: the caller writes them) and steps."""
    ranks = assign_ranks(files)
    origin = min(int(f.columns["start_ns"].min()) for f in files)
    blocks, stacks = [], []
    next_id, next_stack = 0, 0
    for rank, f in _by_rank(ranks, files):
        blocks.append(_event_blocks(f, rank, next_id, next_stack, origin))
        next_id += len(f.columns["start_ns"])
        stacks.append(stacks_from(f.stacks, next_stack))
        next_stack += stack_count(f.columns["stack_id"])
    return Assembled(
        itertools.chain.from_iterable(blocks),
        conform(STACKS, _concat(stacks)),
        _counters(files, ranks, origin) if counters else empty_table(COUNTERS),
        manifest_of(files, ranks, origin),
    )


def _by_rank(ranks: Sequence[int], files: Sequence[FileData]) -> list[tuple[int, FileData]]:
    return sorted(zip(ranks, files, strict=True), key=lambda x: x[0])


def _counters(files: Sequence[FileData], ranks: Sequence[int], origin: int) -> pa.Table:
    """The files' counters as the profile's table, in rank order."""
    tables = [counters_on(f.counters, rank, origin) for rank, f in _by_rank(ranks, files)]
    return conform(COUNTERS, _concat(tables))


def stack_count(stack_id: Any) -> int:
    """How many stack ids a file's events take (numbered from 0): where the next file's begin."""
    return int(stack_id.max()) + 1 if len(stack_id) and stack_id.max() >= 0 else 0


def stacks_from(stacks: dict[str, Any], first_stack: int) -> pa.Table:
    """A file's stacks table with its ids numbered from `first_stack`."""
    st = dict(stacks)
    st["stack_id"] = pa.array(st["stack_id"].to_numpy() + first_stack)
    return pa.table(st)


def counters_on(counters: dict[str, Any], rank: int, origin: int) -> pa.Table:
    """A file's counters (`ts_ns` a numpy column of unix ns) as the profile's rows of `rank`."""
    c = dict(counters)
    c["ts_ns"] = c["ts_ns"] - origin
    c["rank"] = pa.array(np.full(len(c["ts_ns"]), rank, dtype=np.int32))
    c["unit"] = pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(len(c["ts_ns"]), np.int32)), pa.array(["bytes"], pa.string())
    )
    return pa.table(c)


def manifest_of(files: Sequence[Any], ranks: Sequence[int], origin: int) -> Manifest:
    """The manifest of files (FileData, or what rank_runs keeps of one: path, steps, devices,
    meta) given `ranks` on one origin."""
    steps = [
        Step(s, rank, start - origin, dur)
        for rank, f in zip(ranks, files, strict=True)
        for s, start, dur in f.steps
    ]
    many = len(files) > 1
    devices = [
        {**d, "rank": r} if many else d
        for r, f in zip(ranks, files, strict=True)
        for d in f.devices
    ]
    return Manifest(
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
            ],
        },
    )


def write_profile(
    files: Sequence[FileData],
    out: Path,
    *,
    writer: ProfileWriter,
    source_roots: Sequence[Path] = (),
    progress: Callable[[float], None] | None = None,
) -> Path:
    """Assemble the files and write the three tables, the sources and the manifest. The
    counters are written first and let go of (the files give theirs up): held, they would add
    to the events' write, the import's peak (6 MB of the 100 MB benchmark trace's)."""
    report = progress or (lambda f: None)
    assembled = assemble(files, counters=False)
    report(0.3)
    return write_assembled(
        assembled, files, writer=writer, source_roots=source_roots,
        progress=lambda f: report(0.3 + 0.7 * f),
        counter_parts=_taken_counters(files, assembled.manifest.origin_unix_ns),
    )  # fmt: skip


def _taken_counters(files: Sequence[FileData], origin: int) -> Iterator[pa.Table]:
    """The files' counters as one table (the part write_assembled writes), the files no
    longer holding them."""
    table = _counters(files, assign_ranks(files), origin)
    for f in files:
        f.counters = {}
    yield table


def write_assembled(
    assembled: Assembled,
    files: Sequence[Any],
    *,
    writer: ProfileWriter,
    source_roots: Sequence[Path] = (),
    progress: Callable[[float], None] | None = None,
    counter_parts: Iterable[pa.Table] | None = None,
    stack_parts: Iterable[pa.Table] | None = None,
    overlap: bool = False,
) -> Path:
    """Write assembled tables, the sources the files' stacks name, and the manifest
    (`counter_parts`, `stack_parts`: those tables a part at a time, instead of `assembled`'s;
    `overlap`: the events' row groups encoded in a thread while the next block is made, and
    the counters' parts written in another beside them)."""
    report = progress or (lambda f: None)
    beside = None
    if counter_parts is None:  # before the events: not held through their write
        writer.write_table("counters", assembled.counters)
    elif overlap:  # another file, a part held at a time: on the core the merge leaves idle
        beside = ThreadPoolExecutor(1, "counters-write")
        counters = beside.submit(writer.write_table_in_parts, "counters", counter_parts)
    else:
        writer.write_table_in_parts("counters", counter_parts)
    try:
        writer.write_events_in_order(assembled.blocks, overlap=overlap)
        if beside is not None:
            counters.result()
    finally:
        if beside is not None:
            beside.shutdown(wait=True)  # the counters' file closed before anything else
    report(0.7)
    if stack_parts is None:
        writer.write_table("stacks", assembled.stacks)
    else:
        writer.write_table_in_parts("stacks", stack_parts)
    skipped = _copy_sources(writer, files, source_roots)
    manifest = assembled.manifest
    path = writer.commit(replace(manifest, extra={**manifest.extra, **skipped}))
    report(1.0)
    return path


def _concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def _copy_sources(
    writer: ProfileWriter, files: Sequence[Any], source_roots: Sequence[Path]
) -> dict:
    """Keep the text of each user or model file named by a stack: only Python sources under
    the given roots or the trace's own directory, never a path out of them (a trace is
    untrusted input, see capture/sources.py; not the folder above the trace either: a trace
    saved in ~/Downloads would expose every Python file of the home folder). Returns the
    manifest's record of what was skipped."""
    from .sources import Selection, select

    done = Selection()
    for f in files:
        here = f.path.resolve().parent
        chosen = select(sorted(f.user_files), [*source_roots, here])
        for name, text in chosen.kept:
            writer.add_source(name, text)
        done.kept += chosen.kept
        done.skipped += chosen.skipped
    return done.manifest_extra()

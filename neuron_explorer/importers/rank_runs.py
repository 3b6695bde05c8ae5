"""Many trace files (a job's ranks) imported within the memory budget: each file mapped
(kineto.load, or in chunks when its mapping alone would not fit: kineto_chunked) and written at
once to a run on disk, its rows in their order as lz4 Arrow IPC and its counters and stacks
beside them, then let go. At the end the ranks are assigned and the runs written into the
profile in rank order, a row group at a time, with ids, links, stack ids and times shifted as
the in-memory assembly (assemble.py) shifts them: the memory held is one file's mapping, not
the job's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..model.io import MANIFEST, ROW_GROUP_ROWS, ProfileWriter
from ..model.manifest import Manifest
from ..model.schema import COUNTERS, EVENTS, STACKS, conform
from . import kineto, kineto_chunked
from .assemble import (
    Assembled,
    _event_blocks,
    assign_ranks,
    counters_on,
    manifest_of,
    stack_count,
    stacks_from,
    write_assembled,
)
from .kineto_extract import DecodeOptions
from .kineto_route import chunk_folder
from .progress import Share
from .runs import RunFacts, check_facts, check_world_sizes, facts_of, world_size_of

IPC = pa.ipc.IpcWriteOptions(compression="lz4")
FileProgress = Callable[[int, Path], Share]  # a file's index and path -> its progress


@dataclass(frozen=True)
class RankRun:
    """What is kept of one trace file once its rows are on disk: its tables' files and the
    few facts the manifest and the checks read."""

    path: Path  # the trace
    rank: int | None  # distributedInfo.rank
    events: Path  # rows in the events table's order, ids the file's own, times less `base_ns`
    stacks: Path
    counters: Path
    base_ns: int  # the run's times are unix ns less this
    rows: int
    stack_count: int
    facts: RunFacts
    steps: list[tuple[int, int, int]]  # (step, start_unix_ns, dur_ns)
    devices: list[dict[str, Any]]
    meta: dict[str, Any]
    user_files: set[str] = field(default_factory=set)


def write_ranks(
    paths: Sequence[Path],
    writer: ProfileWriter,
    options: DecodeOptions,
    *,
    file_progress: FileProgress,
    write_progress: Callable[[float], None],
    thread_names: bool = True,
    source_roots: Sequence[Path] = (),
    mixed_runs: bool = False,
) -> Path:
    """Import the trace files (one per rank) a file at a time into runs, then write the
    profile from them with `writer`."""
    with chunk_folder() as tmp:
        folder = Path(tmp)
        runs: list[RankRun] = []
        for k, path in enumerate(paths):
            runs.append(
                _run_of(path, folder / str(k), options, thread_names, file_progress(k, path))
            )
            if not mixed_runs:  # a job's world size is refused at its first other file
                check_world_sizes([r.facts for r in runs])
        if not mixed_runs:
            check_facts([r.facts for r in runs])
        return _write(runs, writer, source_roots, write_progress)


def _run_of(
    path: Path, stem: Path, options: DecodeOptions, thread_names: bool, progress: Share
) -> RankRun:
    if kineto_chunked.chunked(path, options):
        return _chunked_run(path, stem, options, thread_names, progress)
    f = kineto.load(path, progress, options, thread_names=thread_names)
    events = stem.with_suffix(".events.arrow")
    with pa.OSFile(str(events), "wb") as sink:
        with pa.ipc.new_stream(sink, EVENTS.arrow_schema(), options=IPC) as out:
            for block in _event_blocks(f, 0, 0, 0, 0):  # unix times, the file's own ids
                out.write_table(conform(EVENTS, block))
    stacks, counters = stem.with_suffix(".stacks.arrow"), stem.with_suffix(".counters.arrow")
    _write_ipc(stacks, pa.table(f.stacks))
    _write_ipc(counters, pa.table(f.counters))
    start, dur = f.columns["start_ns"], f.columns["dur_ns"]
    return RankRun(
        path, f.rank, events, stacks, counters, 0, len(start), stack_count(f.columns["stack_id"]),
        facts_of(path, f.meta, start, dur), f.steps, f.devices, f.meta, f.user_files,
    )  # fmt: skip


def _chunked_run(
    path: Path, stem: Path, options: DecodeOptions, thread_names: bool, progress: Share
) -> RankRun:
    """A file too big for the budget imported in chunks into a one-rank profile, its run."""
    out = stem.with_suffix(".profile")
    with ProfileWriter(out) as one:
        kineto_chunked.write_chunked(path, one, options, thread_names=thread_names,
                                     progress=progress)  # fmt: skip
    manifest = Manifest.from_dict(json.loads((out / MANIFEST).read_text(encoding="utf-8")))
    base = manifest.origin_unix_ns
    (entry,) = manifest.extra["kineto"]
    meta = {k: v for k, v in entry.items() if k not in ("rank", "path")}
    scan = _Scan()
    events = out / EVENTS.file
    for batch in pq.ParquetFile(events).iter_batches(ROW_GROUP_ROWS, columns=_Scan.COLUMNS):
        scan.add(batch)
    span = (scan.first + base, scan.last + base) if scan.rows else None
    return RankRun(
        path, kineto.rank_of(meta.get("distributed")), events, out / STACKS.file,
        out / COUNTERS.file, base, scan.rows, scan.stacks,
        RunFacts(path, world_size_of(meta), span),
        [(s.step, s.start_ns + base, s.dur_ns) for s in manifest.steps],
        [dict(d) for d in manifest.devices], meta, scan.user_files,
    )  # fmt: skip


class _Scan:
    """A chunked member's rows read once for what its run keeps: span, stack count and the
    user and model files its rows name (the sources to keep)."""

    COLUMNS = ["start_ns", "dur_ns", "stack_id", "src_file", "model_file"]

    def __init__(self) -> None:
        self.rows = self.stacks = 0
        self.first, self.last = 1 << 62, -(1 << 62)
        self.user_files: set[str] = set()

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        start, dur = batch.column(0).to_numpy(), batch.column(1).to_numpy()
        self.rows += batch.num_rows
        self.first = min(self.first, int(start.min()))
        self.last = max(self.last, int((start + dur).max()))
        top = pc.max(batch.column(2)).as_py()
        self.stacks = max(self.stacks, top + 1 if top is not None else 0)
        for column in (batch.column(3), batch.column(4)):
            self.user_files.update(x for x in pc.unique(column.cast(pa.string())).to_pylist() if x)


def _write_ipc(path: Path, table: pa.Table) -> None:
    with (
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema, options=IPC) as out,
    ):
        out.write_table(table)


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    """A run's table a batch at a time (a chunked member's Parquet, or an IPC stream)."""
    if path.suffix == ".parquet":
        yield from pq.ParquetFile(path).iter_batches(ROW_GROUP_ROWS)
        return
    with pa.OSFile(str(path), "rb") as source:
        yield from pa.ipc.open_stream(source)


def _table(path: Path) -> pa.Table:
    return pa.Table.from_batches(list(_batches(path)), schema=_schema(path))


def _schema(path: Path) -> pa.Schema:
    if path.suffix == ".parquet":
        return pq.read_schema(path)
    with pa.OSFile(str(path), "rb") as source:
        return pa.ipc.open_stream(source).schema


def _write(
    runs: list[RankRun],
    writer: ProfileWriter,
    source_roots: Sequence[Path],
    progress: Callable[[float], None],
) -> Path:
    ranks = assign_ranks(runs)
    spans = [r.facts.span for r in runs if r.facts.span is not None]
    origin = min(s[0] for s in spans) if spans else 0
    ordered = sorted(zip(ranks, runs, strict=True), key=lambda x: x[0])
    firsts = np.cumsum([0] + [r.rows for _, r in ordered])
    first_stacks = np.cumsum([0] + [r.stack_count for _, r in ordered])
    total = max(1, int(firsts[-1]))

    def blocks() -> Iterator[pa.Table]:
        for (rank, run), first, first_stack in zip(ordered, firsts, first_stacks, strict=False):
            shift = run.base_ns - origin
            for batch in _batches(run.events):
                yield _shifted(
                    pa.Table.from_batches([batch]), rank, int(first), int(first_stack), shift
                )
            progress(0.7 * (first + run.rows) / total)

    def stacks() -> Iterator[pa.Table]:
        for (_, run), first_stack in zip(ordered, first_stacks, strict=False):
            t = _table(run.stacks)
            if run.base_ns:  # a chunked member's profile: already numbered from 0 and conformed
                at = t.schema.get_field_index("stack_id")
                t = t.set_column(at, "stack_id", pc.add(t.column("stack_id"), int(first_stack)))
                yield t
            else:
                yield stacks_from({n: t.column(n) for n in t.column_names}, int(first_stack))

    def counters() -> Iterator[pa.Table]:
        for rank, run in ordered:
            t = _table(run.counters)
            if run.base_ns:
                t = t.drop_columns(["rank", "unit"])
            c: dict[str, Any] = {n: t.column(n) for n in t.column_names}
            c["ts_ns"] = c["ts_ns"].to_numpy() + run.base_ns
            yield counters_on(c, rank, origin)

    assembled = Assembled(
        blocks(), STACKS.arrow_schema().empty_table(), COUNTERS.arrow_schema().empty_table(),
        manifest_of(runs, ranks, origin),
    )  # fmt: skip
    return write_assembled(assembled, runs, writer=writer, source_roots=source_roots,
                           progress=progress, counter_parts=counters(),
                           stack_parts=stacks())  # fmt: skip


def _shifted(t: pa.Table, rank: int, first_id: int, first_stack: int, shift: int) -> pa.Table:
    """A run's block in the profile's numbering: ids and links from `first_id`, stack ids from
    `first_stack`, times on the profile's origin, the rank's."""
    columns = {
        "id": pc.add(t.column("id"), first_id),
        "parent_id": pc.add(t.column("parent_id"), first_id),
        "flow_id": pc.add(t.column("flow_id"), first_id),
        "stack_id": pc.add(t.column("stack_id"), first_stack),
        "start_ns": pc.add(t.column("start_ns"), shift),
        "rank": pa.array(np.full(t.num_rows, rank, np.int32)),
    }
    for name, column in columns.items():
        t = t.set_column(t.schema.get_field_index(name), name, column)
    return t

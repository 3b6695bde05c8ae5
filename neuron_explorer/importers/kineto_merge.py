"""The chunked import's runs: each chunk's rows written as a sorted Parquet run, then the runs
merged into the events table's (start, longest first, trace order) order, a block at a time.

The merge goes over the runs twice. First over their keys alone (start, duration and each row's
index in the trace), a k-way merge by sorted blocks that gives every run's rows their ids in the
whole table; then over the rows, each output block taking from each run the rows whose ids fall
in it, with parent and flow links and stack ids turned from the run's numbering into the
table's. What is held is a block of each run and each row's id (8 bytes a row).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..model.io import ROW_GROUP_ROWS
from ..model.schema import EVENTS, conform
from .assemble import _event_blocks, _order
from .kineto import FileData

READ_ROWS = 1 << 18  # rows of a run read at a time


@dataclass(frozen=True)
class Run:
    """One chunk's rows in their order: the events columns (ids, links and stacks the chunk's
    own) and each row's index in the trace."""

    path: Path
    trace_index_path: Path
    rows: int


def write_run(f: FileData, trace_index: np.ndarray, path: Path) -> Run:
    """Write chunk `f`'s rows in order (`trace_index`: its events' indices in the trace)."""
    assert f.event_index is not None
    order = _order(f)
    tie = path.with_suffix(".tie")
    trace_index[f.event_index[order]].astype(np.int64).tofile(tie)
    schema = EVENTS.arrow_schema()
    with pq.ParquetWriter(path, schema, compression="lz4") as out:
        for block in _event_blocks(f, 0, 0, 0, 0):
            out.write_table(conform(EVENTS, block))
    return Run(path, tie, len(order))


def _keys(run: Run) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A run's (start, -dur, trace index) a block at a time."""
    at = 0
    for batch in pq.ParquetFile(run.path).iter_batches(READ_ROWS, columns=["start_ns", "dur_ns"]):
        n = batch.num_rows
        tie = np.fromfile(run.trace_index_path, np.int64, count=n, offset=8 * at)
        yield batch.column(0).to_numpy(), -batch.column(1).to_numpy(), tie
        at += n


def global_ids(runs: list[Run]) -> list[np.ndarray]:
    """Each run's rows' ids in the merged order (increasing within a run)."""
    ids = [np.empty(r.rows, np.int64) for r in runs]
    readers = [_keys(r) for r in runs]
    buf: list[tuple[np.ndarray, ...] | None] = [None] * len(runs)
    done_at = [0] * len(runs)  # rows of each run given ids
    exhausted = [False] * len(runs)
    next_id = 0
    while True:
        for i, reader in enumerate(readers):
            if (buf[i] is None or not buf[i][0].size) and not exhausted[i]:
                block = next(reader, None)
                exhausted[i] = block is None
                buf[i] = None if block is None else (*block, np.arange(done_at[i], done_at[i] + block[0].size))
        live = [i for i in range(len(runs)) if buf[i] is not None and buf[i][0].size]
        if not live:
            return ids
        parts = [buf[i] for i in live]  # type: ignore[misc]
        start, ndur, tie, local = (np.concatenate([p[k] for p in parts]) for k in range(4))
        run = np.concatenate([np.full(p[0].size, i) for i, p in zip(live, parts, strict=True)])
        order = np.lexsort((tie, ndur, start))
        bound = _bound(live, parts, exhausted)
        take = order if bound is None else order[: int(np.flatnonzero(tie[order] == bound)[0]) + 1]
        for i in live:
            mine = take[run[take] == i]
            ids[i][local[mine]] = next_id + np.flatnonzero(run[take] == i)
            done_at[i] += mine.size
            b = buf[i]
            assert b is not None
            buf[i] = tuple(a[mine.size :] for a in b)
        next_id += take.size


def _bound(live: list[int], parts: list, exhausted: list[bool]) -> int | None:
    """The trace index of the smallest last key among the blocks of runs not read to the end
    (rows up to it can be given ids), None when every run is read to its end."""
    open_runs = [(p[0][-1], p[1][-1], p[2][-1]) for i, p in zip(live, parts, strict=True) if not exhausted[i]]
    return int(min(open_runs)[2]) if open_runs else None


class _RowReader:
    """A run's rows read forward, a slice at a time."""

    def __init__(self, run: Run) -> None:
        self._batches = pq.ParquetFile(run.path).iter_batches(READ_ROWS)
        self._buf = pa.table({})
        self._at = 0

    def take(self, n: int) -> pa.Table:
        parts = []
        while n:
            if self._at >= self._buf.num_rows:
                self._buf, self._at = pa.Table.from_batches([next(self._batches)]), 0
            k = min(n, self._buf.num_rows - self._at)
            parts.append(self._buf.slice(self._at, k))
            self._at += k
            n -= k
        return pa.concat_tables(parts) if parts else pa.table({})


def merged_blocks(
    runs: list[Run], ids: list[np.ndarray], stack_maps: list[np.ndarray], rank: int, origin: int
) -> Iterator[pa.Table]:
    """The runs' rows in the merged order, a row group at a time, in the table's numbering."""
    readers = [_RowReader(r) for r in runs]
    total = sum(r.rows for r in runs)
    lo_of = [0] * len(runs)
    for g0 in range(0, total, ROW_GROUP_ROWS):
        g1 = min(total, g0 + ROW_GROUP_ROWS)
        parts = []
        for i, reader in enumerate(readers):
            hi = int(np.searchsorted(ids[i], g1))
            lo, lo_of[i] = lo_of[i], hi
            if hi > lo:
                parts.append(_renumbered(reader.take(hi - lo), ids[i], lo, stack_maps[i], rank, origin))
        block = pa.concat_tables(parts).unify_dictionaries().combine_chunks()
        yield block.take(pc.sort_indices(block.column("id")))


def _renumbered(
    t: pa.Table, ids: np.ndarray, lo: int, stack_map: np.ndarray, rank: int, origin: int
) -> pa.Table:
    def link(name: str) -> pa.Array:
        local = t.column(name).to_numpy(zero_copy_only=False)
        valid = pc.is_valid(t.column(name)).to_numpy(zero_copy_only=False)
        return pa.array(ids[np.where(valid, local, 0).astype(np.int64)], mask=~valid)

    sid = t.column("stack_id")
    valid = pc.is_valid(sid).to_numpy(zero_copy_only=False)
    local_sid = pc.fill_null(sid, 0).to_numpy(zero_copy_only=False)
    columns = {
        "id": pa.array(ids[lo : lo + t.num_rows]),
        "rank": pa.array(np.full(t.num_rows, rank, np.int32)),
        "parent_id": link("parent_id"),
        "flow_id": link("flow_id"),
        "stack_id": pa.array(stack_map[local_sid] if stack_map.size else local_sid, mask=~valid),
        "start_ns": pc.subtract(t.column("start_ns"), origin),
    }
    for name, col in columns.items():
        t = t.set_column(t.schema.get_field_index(name), name, col)
    return t

"""The chunked import's runs: each chunk's rows written as a sorted run (an Arrow IPC stream,
its sort keys in a file beside it), then the runs merged into the events table's (start,
longest first, trace order) order, a block at a time.

A run is written once and read once, here, so it is Arrow's own format, not Parquet: no
encoding nor decoding of its columns (Parquet's were a quarter of the merge and write). The
merge goes over the runs twice. First over their keys alone (start, duration and each row's
index in the trace), a k-way merge by sorted blocks that gives every run's rows their ids in
the whole table; then over the rows, each output block taking from each run the rows whose ids
fall in it, with parent and flow links and stack ids turned from the run's numbering into the
table's. What is held is a block of each run and each row's id (4 bytes a row).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.io import ROW_GROUP_ROWS
from ..model.schema import EVENTS, conform
from .assemble import _event_blocks, _order
from .kineto import FileData

RUN_GROUP_ROWS = 1 << 14  # a run's record batch: every run holds one while the runs are merged
READ_ROWS = RUN_GROUP_ROWS
# a run's keys, a row's: its start, its duration negated (longest first) and its trace index
RUN_IPC = pa.ipc.IpcWriteOptions(compression="lz4")
RUN_KEY = np.dtype([("start", "<i8"), ("ndur", "<i8"), ("tie", "<i8")])


@dataclass(frozen=True)
class Run:
    """One chunk's rows in their order: the events columns (ids, links and stacks the chunk's
    own), and each row's RUN_KEY."""

    path: Path
    keys_path: Path
    rows: int


def write_run(f: FileData, trace_index: np.ndarray, path: Path) -> Run:
    """Write chunk `f`'s rows in order (`trace_index`: its events' indices in the trace)."""
    assert f.event_index is not None
    order = _order(f)
    keys = np.empty(order.size, RUN_KEY)
    keys["start"] = f.columns["start_ns"][order]
    keys["ndur"] = -f.columns["dur_ns"][order]
    keys["tie"] = trace_index[f.event_index[order]]
    keys_path = path.with_suffix(".keys")
    keys.tofile(keys_path)
    del keys
    # a stream, not an IPC file: each block has dictionaries of its own, which a file refuses
    with (
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_stream(sink, EVENTS.arrow_schema(), options=RUN_IPC) as out,
    ):
        # the freed heap kept for the next block (kineto_heap), not given back after each
        for block in _event_blocks(f, 0, 0, 0, 0, trim=False):
            out.write_table(conform(EVENTS, block), RUN_GROUP_ROWS)
    return Run(path, keys_path, len(order))


class _Keys:
    """A run's keys (RUN_KEY, in the run's row order, which is the key order) read a block at a
    time; `buf` holds those not yet given ids, `first` the run's row of `buf[0]`."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self.read = 0  # rows read
        self.first = 0
        self.buf = np.zeros(0, RUN_KEY)

    def fill(self) -> None:
        """Read the next block once the buffer is empty."""
        n = min(READ_ROWS, self._run.rows - self.read)
        if self.buf.size or not n:
            return
        offset = RUN_KEY.itemsize * self.read
        self.buf = np.fromfile(self._run.keys_path, RUN_KEY, count=n, offset=offset)
        self.first, self.read = self.read, self.read + n

    def more(self) -> bool:
        """Whether rows are left in the file past the buffer."""
        return self.read < self._run.rows

    def take(self, n: int) -> None:
        self.buf, self.first = self.buf[n:], self.first + n


def global_ids(runs: list[Run]) -> list[np.ndarray]:
    """Each run's rows' ids in the merged order (increasing within a run): a k-way merge of
    sorted blocks, each round giving ids to the rows up to the smallest last key among the
    blocks of runs with rows still to read. Only the rows up to that key are sorted, and
    those of one run (a chunk is a stretch of time: most rounds) are numbered in place: the
    other runs' blocks were sorted again every round, the merge's ids 1.5 s of CPU a GB."""
    index = np.int32 if sum(r.rows for r in runs) < 2**31 else np.int64  # 4 bytes a row held
    ids = [np.empty(r.rows, index) for r in runs]
    keys = [_Keys(r) for r in runs]
    next_id = 0
    while True:
        for k in keys:
            k.fill()
        live = [i for i, k in enumerate(keys) if k.buf.size]
        if not live:
            return ids
        bounds = [keys[i].buf[-1:] for i in live if keys[i].more()]
        bound = min(bounds, key=lambda b: b.item()) if bounds else None
        cuts = [keys[i].buf.size if bound is None else
                int(np.searchsorted(keys[i].buf, bound, "right")[0]) for i in live]  # fmt: skip
        taking = [(i, c) for i, c in zip(live, cuts, strict=True) if c]
        if len(taking) == 1:
            (i, c), k = taking[0], keys[taking[0][0]]
            ids[i][k.first : k.first + c] = next_id + np.arange(c)
        else:
            key = np.concatenate([keys[i].buf[:c] for i, c in taking])
            order = np.lexsort((key["tie"], key["ndur"], key["start"]))
            run = np.repeat(np.arange(len(taking)), [c for _, c in taking])[order]
            at_first = 0
            for j, (i, c) in enumerate(taking):
                at = np.flatnonzero(run == j)
                ids[i][keys[i].first + order[at] - at_first] = next_id + at
                at_first += c
        for i, c in taking:
            keys[i].take(c)
        next_id += sum(c for _, c in taking)


class _RowReader:
    """A run's rows read forward, a slice at a time."""

    def __init__(self, run: Run) -> None:
        self._file = pa.OSFile(str(run.path), "rb")
        self._batches = iter(pa.ipc.open_stream(self._file))
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

    def close(self) -> None:
        self._file.close()


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
            hi = int(np.searchsorted(ids[i], ids[i].dtype.type(g1)))  # no cast of ids[i]
            lo, lo_of[i] = lo_of[i], hi
            if hi > lo:
                parts.append(
                    _renumbered(reader.take(hi - lo), ids[i], lo, stack_maps[i], rank, origin)
                )
        block = pa.concat_tables(parts).unify_dictionaries().combine_chunks()
        ids_here = block.column("id").to_numpy()
        if len(parts) > 1 and (ids_here[1:] < ids_here[:-1]).any():
            # runs interleave here; a block from one run (mostly: a chunk is a stretch of
            # time) is in order already
            block = block.take(pc.sort_indices(block.column("id")))
        yield block
        del block, parts  # their heap reused by the next block (kineto_heap), not given back


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

"""Writing and reading profile directories. Writes are atomic: a temporary sibling directory
is filled, then renamed into place, so an interrupted write never looks like a profile."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import __version__
from ..errors import ExplorerError
from ..vocab.kinds import LAYERS, undeclared
from .manifest import Manifest
from .schema import (
    COUNTERS,
    EVENTS,
    OPTIONAL_TABLES,
    STACKS,
    TABLES,
    Table,
    conform,
    empty_table,
)

MANIFEST = "manifest.json"
SOURCES = "sources"
ROW_GROUP_ROWS = 64 * 1024  # small enough for predicate push-down on start_ns


# JSON text columns: their min/max statistics cost a fifth of an events write and filter nothing
NO_STATISTICS = frozenset({"args", "shapes", "dtypes", "inputs", "outputs", "sources", "exported"})
ZSTD_LEVEL = 1  # measured: as small as the default level on profiles, 10% faster to write


def _parquet_options(table: Table) -> dict:
    return {
        "compression": "zstd",
        "compression_level": ZSTD_LEVEL,
        # only the declared dictionary columns: encoding args/shapes text costs a quarter of the write
        "use_dictionary": [c.name for c in table.columns if pa.types.is_dictionary(c.type)],
        "write_statistics": [c.name for c in table.columns if c.name not in NO_STATISTICS],
    }


def _write_table(table: Table, data: pa.Table, path: Path) -> None:
    pq.write_table(data, path, row_group_size=ROW_GROUP_ROWS, **_parquet_options(table))


def _sort_events(events: pa.Table) -> pa.Table:
    """Events in (rank, start_ns, id) order; a table already in that order is kept as it is
    (the importers write it so: a sort would copy every column)."""
    if _is_sorted(events):
        return events
    return events.sort_by([("rank", "ascending"), ("start_ns", "ascending"), ("id", "ascending")])


def _order_keys(events: pa.Table) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(rank, start_ns, id) of the first and the last event."""
    cols = [events.column(c) for c in ("rank", "start_ns", "id")]
    return (
        tuple(int(c[0].as_py()) for c in cols),  # type: ignore[return-value]
        tuple(int(c[-1].as_py()) for c in cols),
    )


def _is_sorted(events: pa.Table) -> bool:
    if events.num_rows < 2:
        return True
    rank, start, ids = (
        np.diff(events.column(c).to_numpy().astype(np.int64)) for c in ("rank", "start_ns", "id")
    )
    return bool(np.all((rank > 0) | ((rank == 0) & ((start > 0) | ((start == 0) & (ids > 0))))))


def _check_declared(events: pa.Table) -> pa.Table:
    """`events` itself, once every kind and layer in it is declared (vocab/kinds.py): a producer
    that invents one fails here, not later in an analysis that never reads it."""
    bad = undeclared(pc.unique(events.column("kind")).to_pylist())
    if bad:
        raise ValueError(f"events: undeclared event kinds {bad} (declare them in vocab/kinds.py)")
    layers = set(pc.unique(events.column("layer")).to_pylist()) - set(LAYERS)
    if layers:
        raise ValueError(f"events: undeclared layers {sorted(map(str, layers))} (not {LAYERS})")
    return events


class ProfileWriter:
    """Fills a temporary directory beside `path`; `commit()` renames it to `path`.

    Use as a context manager: leaving the block without `commit()` (or with an exception)
    removes the temporary directory.
    """

    def __init__(self, path: str | Path, *, overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise ExplorerError(f"{self.path}: output path exists; choose another or remove it")
        self.overwrite = overwrite
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.path)
        self.tmp = Path(
            tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-{os.getpid()}-", dir=self.path.parent)
        )
        self._counts: dict[str, int] = {}

    def __enter__(self) -> ProfileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()

    def abort(self) -> None:
        if self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)

    def write_events(self, events: pa.Table | dict) -> None:
        """Write events; several ranks go to events/rank=N/part-0.parquet."""
        data = _sort_events(_check_declared(conform(EVENTS, events)))
        ranks = pa.compute.unique(data.column("rank")).to_pylist()
        if len(ranks) <= 1:
            _write_table(EVENTS, data, self.tmp / EVENTS.file)
        else:
            for rank in sorted(ranks):
                part = data.filter(pa.compute.equal(data.column("rank"), rank))
                d = self.tmp / "events" / f"rank={rank}"
                d.mkdir(parents=True)
                _write_table(EVENTS, part, d / "part-0.parquet")
        self._counts["events"] = data.num_rows

    def write_events_in_order(
        self, blocks: Iterable[pa.Table | dict], *, overlap: bool = False
    ) -> None:
        """Write events that come already in (rank, start_ns, id) order, in blocks of at most
        ROW_GROUP_ROWS rows of one rank each: one row group per block, so the whole table never
        exists at once. Each block is written and let go of before the next is made, unless
        `overlap`: then a block is encoded in a thread (Parquet's encoding lets go of the GIL)
        while the next is made, two held at once (12 MB more at the peak of the 100 MB
        benchmark trace's import, so only where a core would otherwise wait: the chunked
        import's merge). Several ranks go to events/rank=N/part-0.parquet."""
        writers: dict[int, pq.ParquetWriter] = {}
        last: tuple[int, int, int] | None = None
        count = 0
        pool = ThreadPoolExecutor(1, "events-write") if overlap else None
        pending: Future | None = None
        try:
            for block in blocks:
                data = _check_declared(conform(EVENTS, block))
                del block  # the block's columns are the table's now
                if data.num_rows == 0:
                    continue
                first, end = _order_keys(data)
                if last is not None and first <= last or not _is_sorted(data):
                    raise ValueError("events: blocks are not in (rank, start_ns, id) order")
                if data.num_rows > ROW_GROUP_ROWS or first[0] != end[0]:
                    raise ValueError("events: a block is larger than a row group or spans ranks")
                last, count = end, count + data.num_rows
                writer = writers.get(first[0]) or self._events_writer(writers, first[0])
                if pending is not None:  # the row groups in order, one encoded at a time
                    pending.result()
                if pool is None:
                    writer.write_table(data, ROW_GROUP_ROWS)
                else:
                    pending = pool.submit(writer.write_table, data, ROW_GROUP_ROWS)
                del data
            if pending is not None:
                pending.result()
        finally:
            if pool is not None:
                pool.shutdown(wait=True)  # no writer closed under a row group still encoding
            for writer in writers.values():
                writer.close()
        if len(writers) > 1 and (self.tmp / EVENTS.file).exists():  # rank 0 went first alone
            d = self.tmp / "events" / f"rank={min(writers)}"
            d.mkdir(parents=True)
            os.replace(self.tmp / EVENTS.file, d / "part-0.parquet")
        if count:
            self._counts["events"] = count

    def _events_writer(self, writers: dict[int, pq.ParquetWriter], rank: int) -> pq.ParquetWriter:
        """The writer of a rank's events: events.parquet for the first; once there are two,
        events/rank=N/part-0.parquet (the first is moved there at the end)."""
        if writers:
            d = self.tmp / "events" / f"rank={rank}"
            d.mkdir(parents=True)
            path = d / "part-0.parquet"
        else:
            path = self.tmp / EVENTS.file
        writers[rank] = pq.ParquetWriter(path, EVENTS.arrow_schema(), **_parquet_options(EVENTS))
        return writers[rank]

    def write_table(self, name: str, data: pa.Table | dict) -> None:
        """Write one table (an optional one too: OPTIONAL_TABLES)."""
        table = TABLES.get(name) or OPTIONAL_TABLES[name]
        if table is EVENTS:
            return self.write_events(data)
        conformed = conform(table, data)
        _write_table(table, conformed, self.tmp / table.file)
        self._counts[name] = conformed.num_rows

    def write_table_in_parts(self, name: str, parts: Iterable[pa.Table | dict]) -> None:
        """Write one table (not events) from parts that come one at a time, each its own row
        groups: the whole table never exists at once."""
        table = TABLES.get(name) or OPTIONAL_TABLES[name]
        assert table is not EVENTS, "events: write_events_in_order"
        count = 0
        with pq.ParquetWriter(self.tmp / table.file, table.arrow_schema(),
                              **_parquet_options(table)) as out:  # fmt: skip
            for part in parts:
                conformed = conform(table, part)
                out.write_table(conformed, ROW_GROUP_ROWS)
                count += conformed.num_rows
        self._counts[name] = count

    def add_source(self, file: str, text: str) -> None:
        """Keep the text of a user source file, stored under sources/ by its path."""
        rel = source_relpath(file)
        dest = self.tmp / SOURCES / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")

    def commit(self, manifest: Manifest) -> Path:
        for table in (EVENTS, STACKS, COUNTERS):
            if table.name not in self._counts:
                self.write_table(table.name, empty_table(table))
        manifest = replace(
            manifest,
            row_counts=dict(self._counts),
            producer=manifest.producer or f"neuron-explorer {__version__}",
        )
        tmp_manifest = self.tmp / (MANIFEST + ".part")
        tmp_manifest.write_text(manifest.to_json(), encoding="utf-8")
        os.replace(tmp_manifest, self.tmp / MANIFEST)
        if self.path.exists() and self.overwrite:
            trash = Path(
                tempfile.mkdtemp(
                    prefix=f".{self.path.name}.old-{os.getpid()}-", dir=self.path.parent
                )
            )
            os.replace(self.path, trash / "old")
            os.replace(self.tmp, self.path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(self.tmp, self.path)
        return self.path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's live process (or a name that is not ours): leave it
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove what killed writers of `path` left beside it (`.NAME.tmp-PID-*`, `.NAME.old-PID-*`
    whose process is gone), so they do not pile up; live writers' directories are kept."""
    removed = []
    for kind in ("tmp", "old"):
        for p in path.parent.glob(f".{glob.escape(path.name)}.{kind}-*-*"):
            pid = p.name[len(path.name) + len(kind) + 3 :].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def source_relpath(file: str) -> str:
    """Where a source file's text lives under sources/: its absolute path without the root."""
    p = Path(file)
    parts = [x for x in p.parts if x not in ("/", "\\", "..", ".") and not x.endswith(":")]
    return str(Path(*parts)) if parts else "_"

"""The chunked import's decoded ranges: the first pass keeps each range's columns (a Piece, its
codes numbered within the range) in a file as it decodes them, the routing hands each range's
record to its chunk (split only where a range's events go to several), and each chunk's
columns are joined from its records into the Decoded its mapping reads. So every event is
decoded once, not once to plan and again, from its chunk's text, to map.

A record is a pickle after its length and event count (written and read only by this import,
in its own private folder, never a file from outside). Its codes are the range's own (values
numbered by first use in the range, only those used), so records join in any grouping exactly
as one decode of their events would number them (kineto_extract._merge renumbers spans' codes
in file order).
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from . import kineto_decode as kd
from . import kineto_native as native
from .kineto_columns import give_back_free_memory
from .kineto_extract import Decoded, _merge
from .kineto_frames import compact
from .kineto_kinds import LANE_NAME_EVENTS, MEMORY_EVENT, roles
from .kineto_ranges import FIELDS, Piece, Span, phases
from .kineto_spill import TextSpill, spill_directory

HEAD = struct.Struct("<QQ")  # before a record's pickle: its length and the record's events


@dataclass
class Record:
    """One range's decoded events (or the part of them that goes to one chunk)."""

    n: int
    codes: dict[str, np.ndarray]  # FIELDS -> codes into `values` (-1: none)
    values: dict[str, list[Any]]  # FIELDS -> the values the codes use, by first use
    ts: kd.Times
    dur: kd.Times
    row_args: pa.Array  # the args texts of the events that are rows
    typed: dict[str, tuple[pa.Array, ...]]  # kineto_args.SUBSETS -> each subset's columns


def record_of(piece: Piece, values: dict[str, list[Any]], per_range: tuple[str, ...]) -> Record:
    """A range's piece (codes into the span's `values`; those of `per_range` fields into the
    range's own, already numbered by first use) as a record of its own."""
    codes, own = {}, {}
    for f in FIELDS:
        if f in per_range:
            codes[f], own[f] = piece.codes[f], values[f]
        else:
            codes[f], own[f] = _local(piece.codes[f], values[f])
        # a range's few distinct values: its codes in int8 or int16 mostly (the records are
        # written and read back whole: 18 bytes an event less of 100)
        codes[f] = compact(codes[f])
    n = len(piece.ts.ns)
    return Record(n, codes, own, piece.ts, piece.dur, piece.row_args, piece.typed)


def _local(codes: np.ndarray, values: list[Any]) -> tuple[np.ndarray, list[Any]]:
    """`codes` renumbered by first use, and the values they use in that order."""
    if not codes.size:
        return codes.astype(np.int32), []
    got = native.first_use(codes, len(values))  # one pass, no sort
    if got is not None:
        return got[0], [values[c] for c in got[1].tolist()]
    u, first, inv = np.unique(codes, return_index=True, return_inverse=True)
    used = u[np.argsort(first, kind="stable")]
    used = used[used >= 0]
    new = np.full(u.size, -1, np.int32)
    new[np.searchsorted(u, used)] = np.arange(used.size, dtype=np.int32)
    return new[inv.reshape(-1)], [values[c] for c in used.tolist()]


def dump(record: Record) -> bytes:
    """The record as the files hold it."""
    data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    return HEAD.pack(len(data), record.n) + data


def read_all(path: Path) -> Iterator[Record]:
    """The records of a file, in order."""
    with path.open("rb") as f:
        while head := f.read(HEAD.size):
            yield pickle.loads(f.read(HEAD.unpack(head)[0]))


def next_raw(f: BinaryIO) -> tuple[int, int, int] | None:
    """The next record's place in `f`, its size (its head included) and its events; `f`
    moves past it. None at the end of the file."""
    at = f.tell()
    head = f.read(HEAD.size)
    if not head:
        return None
    data, n = HEAD.unpack(head)
    f.seek(at + HEAD.size + data, os.SEEK_SET)
    return at, HEAD.size + data, n


def read_at(f: BinaryIO, at: int, size: int) -> Record:
    """The record at `at` (from next_raw); `f`'s position is kept."""
    back = f.tell()
    f.seek(at + HEAD.size)
    record: Record = pickle.loads(f.read(size - HEAD.size))
    f.seek(back)
    return record


def split(record: Record, chunk: np.ndarray, chunks: int) -> dict[int, Record]:
    """The record's events by chunk (-1: metadata, in every chunk), each part in its order."""
    v = record.values
    ph = phases(v["ph"], record.codes["ph"])
    names = record.codes["name"]
    memory = names == (v["name"].index(MEMORY_EVENT) if MEMORY_EVENT in v["name"] else -2)
    lane = np.isin(names, [i for i, n in enumerate(v["name"]) if n in LANE_NAME_EVENTS])
    r = roles(ph, record.codes["cat"], v["cat"], memory, lane)
    every = chunk < 0
    parts = {}
    for k in range(chunks) if every.any() else np.unique(chunk).tolist():
        sel = np.flatnonzero((chunk == k) | every)
        if sel.size:
            parts[k] = _take(record, sel, r.is_row, r.typed_subsets())
    return parts


def _take(record: Record, sel: np.ndarray, is_row: np.ndarray, subsets: dict) -> Record:
    codes, values = {}, {}
    for f in FIELDS:
        codes[f], values[f] = _local(record.codes[f][sel], record.values[f])
        codes[f] = compact(codes[f])

    def times(t: kd.Times) -> kd.Times:
        return kd.Times(t.ns[sel], t.missing[sel], t.out_of_range[sel])

    def rows_of(mask: np.ndarray) -> np.ndarray:
        return (np.cumsum(mask) - 1)[sel[mask[sel]]]

    typed = {
        key: tuple(c.take(rows_of(subsets[key])) for c in cols)
        for key, cols in record.typed.items()
    }
    row_args = record.row_args.take(rows_of(is_row))
    return Record(sel.size, codes, values, times(record.ts), times(record.dur), row_args, typed)


def read_segments(segments: Sequence[tuple[str, int, int]]) -> Iterator[Record]:
    """The records at (file, place, size) `segments`, in order (a few files, each opened once)."""
    files: dict[str, BinaryIO] = {}
    try:
        for name, at, size in segments:
            if name not in files:
                files[name] = open(name, "rb")
            yield read_at(files[name], at, size)
    finally:
        for f in files.values():
            f.close()


def decoded(segments: Sequence[tuple[str, int, int]], top: dict[str, Any]) -> Decoded:
    """A chunk's records joined into the columns a decode of its events gives (`top`: the
    trace's top-level keys), the args texts spilled to disk as the streaming import's are."""
    give_back_free_memory()  # the previous chunk's, before this one's columns come
    spill = TextSpill(spill_directory())
    # the records' codes renumbered into the chunk's as they are read (as _merge renumbers
    # spans'), so that a value is held once, not once a record
    factorizers = {f: kd.Factorizer() for f in FIELDS}
    span = Span(values={f: z.seen for f, z in factorizers.items()})
    try:
        for rec in read_segments(segments):
            spill.append(rec.row_args)
            codes = {
                f: compact(factorizers[f].remap(rec.values[f])[c]) for f, c in rec.codes.items()
            }
            span.pieces.append(Piece(codes, rec.ts, rec.dur, None, rec.typed))  # type: ignore[arg-type]
    except BaseException:
        spill.finish().close()
        raise
    span.top = {k: v for k, v in top.items() if v is not None}
    d = _merge([span], row_args=spill.finish(), joined=give_back_free_memory)
    give_back_free_memory()
    return d

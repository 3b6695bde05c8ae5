"""The chunked import's second pass: each range's decoded events (the first pass's records,
kineto_pieces) handed to its chunk's file, as kineto_plan's route keys say, so that each chunk
is the columns the mapping reads, decoded once.

Every chunk gets all the trace's metadata events (they name the lanes), and a sidecar of the
trace-wide index of each of its events, which orders rows that tie on (start, duration) across
chunks as the trace's own order does. A range whose events all go to one chunk, most of them,
stays where the first pass wrote its record (the chunk lists it); only the others are split,
into the chunk's own file. A span of the file can be routed on its own into parts of the
chunks' files (kineto_plan_spans), their lists joined after.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import BadInputError
from . import kineto_pieces as pieces
from .kineto_plan import COUNTER, METADATA, ROUTE_KEY, Plan
from .kineto_ranges import RangeError
from .progress import Share

Segment = tuple[str, int, int]  # a record: the file it is in, its place there and its size


@dataclass(frozen=True)
class Chunk:
    """One chunk's records (kineto_pieces) and the trace-wide index of each of its events (in
    its order). `records`: every record in order, each where it lies: a range's record whose
    events all go to this chunk where the first pass wrote it (not copied), a split one in the
    chunk's own file `path` (or, routed by spans in parallel, a span's part of it: `parts`, the
    parts' suffixes in the file's order, as of the index file)."""

    path: Path
    index_path: Path
    parts: tuple[str, ...] = ()
    records: tuple[Segment, ...] = ()

    def index_files(self) -> list[Path]:
        if not self.parts:
            return [self.index_path]
        return [Path(f"{self.index_path}{p}") for p in self.parts]

    def event_index(self) -> np.ndarray:
        parts = [np.fromfile(f, dtype=np.int64) for f in self.index_files()]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def remove(self) -> None:
        """Its own records' files, once mapped (the first pass's are shared: removed with the
        folder)."""
        for p in self.parts or ("",):
            Path(f"{self.path}{p}").unlink(missing_ok=True)


class ChunkWriters:
    """The chunks' files (or one span's parts of them), open while the trace is routed, and
    each chunk's records as they come."""

    def __init__(self, chunks: list[Chunk], suffix: str = "") -> None:
        self.paths = [f"{c.path}{suffix}" for c in chunks]
        self.records = [_create(Path(p)) for p in self.paths]
        self.sizes = [0] * len(chunks)
        self.segments: list[list[Segment]] = [[] for _ in chunks]
        self.index: list[BinaryIO] = [Path(f"{c.index_path}{suffix}").open("wb") for c in chunks]
        self.started = [False] * len(chunks)

    def write(self, k: int, record: pieces.Record, index: np.ndarray) -> None:
        data = pieces.dump(record)
        _write_all(self.records[k], data)
        self.segments[k].append((self.paths[k], self.sizes[k], len(data)))
        self.sizes[k] += len(data)
        self.started[k] = True
        index.astype(np.int64).tofile(self.index[k])

    def copy(self, k: int, src: Path, at: int, size: int, index: np.ndarray) -> None:
        """The record of `size` bytes at `at` in file `src` to chunk k: read from there (a
        copy was another write of most of the records: 5 GB at 10 GB of trace)."""
        self.segments[k].append((str(src), at, size))
        self.started[k] = True
        index.astype(np.int64).tofile(self.index[k])

    def close(self) -> Routed:
        """Which chunks have events, and each chunk's records."""
        for fd in self.records:
            os.close(fd)
        for f in self.index:
            f.close()
        return self.started, self.segments


Routed = tuple[list[bool], list[list[Segment]]]  # a routing's ChunkWriters.close()


def _create(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


def chunks_of(plan: Plan, folder: Path) -> list[Chunk]:
    return [
        Chunk(folder / f"chunk-{k}.records", folder / f"chunk-{k}.idx") for k in range(plan.chunks)
    ]


def route(path: Path, plan: Plan, folder: Path, progress: Share) -> list[Chunk]:
    """Hand each range's record to its chunk's file under `folder`, as the route keys (written
    by the first pass) say."""
    chunks = chunks_of(plan, folder)
    writers = ChunkWriters(chunks)
    try:
        route_span(path, plan, 0, len(plan.spans), writers, progress)
    finally:
        _, segments = writers.close()
    return [replace(c, records=tuple(s)) for c, s in zip(chunks, segments, strict=True)]


def route_span(
    path: Path, plan: Plan, first: int, last: int, writers: ChunkWriters, progress: Share
) -> None:
    """Route the records of the plan's spans `first` to `last` (excluded): a record whose
    events all go to one chunk is copied as it lies (most are: a chunk is many ranges), the
    others split by chunk."""
    done = sum(plan.span_events[:first])
    end = sum(plan.span_events[:last])
    try:
        for span in range(first, last):
            with plan.keys[span].open("rb") as keys_file, plan.records[span].open("rb") as f:
                while (raw := pieces.next_raw(f)) is not None:
                    at, size, count = raw
                    key = _read_keys([keys_file], count)
                    if key.size != count:
                        raise RangeError("the trace changed since it was read")
                    chunk = _chunk_of_events(plan, key)
                    index = np.arange(done, done + count, dtype=np.int64)
                    if chunk[0] >= 0 and (chunk == chunk[0]).all():
                        writers.copy(int(chunk[0]), plan.records[span], at, size, index)
                    else:
                        parts = pieces.split(pieces.read_at(f, at, size), chunk, plan.chunks)
                        for k, part in parts.items():
                            writers.write(k, part, index[(chunk == k) | (chunk < 0)])
                    done += count
                    progress(done / max(1, plan.events), done)
    except RangeError as e:  # not expected: the first pass wrote both files
        raise BadInputError(path, f"invalid JSON ({e})") from None
    if done != end:
        raise BadInputError(path, "the trace changed since it was read")


def _read_keys(files: list[BinaryIO], count: int) -> np.ndarray:
    """The next `count` route keys, on from one span's file to the next."""
    got = []
    while files and count:
        key = np.fromfile(files[0], ROUTE_KEY, count=count)
        got.append(key)
        count -= key.size
        if count:
            files.pop(0)
    return np.concatenate(got) if got else np.zeros(0, ROUTE_KEY)


def join_parts(chunks: list[Chunk], routed: list[Routed]) -> list[Chunk]:
    """The chunks as the spans routed them (`routed[span]`: which chunks got events, and their
    records): each chunk's records in span order, its index in the spans' parts of its file,
    read one after another (not copied into one file); the empty parts removed."""
    joined = []
    for k, chunk in enumerate(chunks):
        spans = [i for i, (started, _) in enumerate(routed) if started[k]]
        for i in range(len(routed)):
            if i not in spans:
                for target in (chunk.path, chunk.index_path):
                    Path(f"{target}.part{i}").unlink(missing_ok=True)
        if not spans:  # no events: empty files, as one span's routing leaves them
            for target in (chunk.path, chunk.index_path):
                os.close(_create(target))
        records = tuple(r for i in spans for r in routed[i][1][k])
        joined.append(replace(chunk, parts=tuple(f".part{i}" for i in spans), records=records))
    return joined


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view.nbytes:
        view = view[os.write(fd, view) :]


def _chunk_of_events(plan: Plan, key: np.ndarray) -> np.ndarray:
    """Each event's chunk by its route key, -1 for metadata (every chunk's)."""
    chunk = plan.chunk_of_time(key["ts"])
    dev = np.flatnonzero(key["corr"] >= 0)
    if dev.size:  # device work goes with its launch, when the trace has it
        launched = plan.chunk_of_launch(key["corr"][dev])
        chunk[dev] = np.where(launched >= 0, launched, chunk[dev])
    if plan.samples_first:
        chunk[key["flag"] == COUNTER] = 0
    chunk[key["flag"] == METADATA] = -1
    return chunk


def chunk_folder() -> tempfile.TemporaryDirectory:
    """Where the chunks' files go: $NEURON_EXPLORER_SPILL_DIR, else the system's temporary
    folder."""
    from .kineto_spill import spill_directory

    return tempfile.TemporaryDirectory(prefix="neuron-explorer-chunks-", dir=spill_directory())

"""The chunked import's second pass: each event's own bytes copied to its chunk's trace file
(kineto_plan says which), so that each chunk is a trace the in-memory mapping imports as it is.

Every chunk file has the trace's top-level keys and all its metadata events (they name the
lanes), and a sidecar of the trace-wide index of each of its events, which orders rows that tie
on (start, duration) across chunks as the trace's own order does. A plain file is routed by the
first pass's ranges: a range whose events all go to one chunk, most of them, is copied as the
file has it, in the kernel; only the others are split into events' texts. A span of the file
can be routed on its own into parts of the chunks' files (kineto_plan_spans), joined after.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec
import numpy as np

from ..errors import BadInputError
from .kineto_plan import COUNTER, METADATA, ROUTE_KEY, Plan
from .kineto_ranges import FileSource, RangeError, decode_span
from .kineto_stream import StreamSource, open_stream
from .progress import Share


@dataclass(frozen=True)
class Chunk:
    """One chunk's trace file and the trace-wide index of each of its events (in its order)."""

    path: Path
    index_path: Path

    def event_index(self) -> np.ndarray:
        return np.fromfile(self.index_path, dtype=np.int64)


class ChunkWriters:
    """The chunks' files (or one span's parts of them), open while the trace is routed."""

    def __init__(self, chunks: list[Chunk], head: bytes, suffix: str = "") -> None:
        # the texts unbuffered: a range is copied into them in the kernel (copy_file_range)
        self.text = [_create(Path(f"{c.path}{suffix}")) for c in chunks]
        self.index: list[BinaryIO] = [Path(f"{c.index_path}{suffix}").open("wb") for c in chunks]
        self.started = [False] * len(chunks)
        for fd in self.text:
            _write_all(fd, head)

    def write(self, k: int, raws: list[msgspec.Raw], index: np.ndarray) -> None:
        if not raws:
            return
        if self.started[k]:
            _write_all(self.text[k], b",\n")
        _write_all(self.text[k], b",\n".join(raws))  # a Raw is a buffer: joined, not copied
        self.started[k] = True
        index.astype(np.int64).tofile(self.index[k])

    def copy(self, k: int, trace: int, lo: int, hi: int, index: np.ndarray) -> None:
        """Bytes `lo` to `hi` of the trace (whole events and the commas between) to chunk k."""
        if self.started[k]:
            _write_all(self.text[k], b",\n")
        _copy_all(trace, self.text[k], hi - lo, lo)
        self.started[k] = True
        index.astype(np.int64).tofile(self.index[k])

    def close(self, tail: bytes) -> list[bool]:
        """Which files have events."""
        for fd in self.text:
            _write_all(fd, tail)
            os.close(fd)
        for f in self.index:
            f.close()
        return self.started


def _create(path: Path) -> int:
    # not O_APPEND: copy_file_range refuses a file opened for appending
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


def chunks_of(plan: Plan, folder: Path) -> list[Chunk]:
    return [
        Chunk(folder / f"chunk-{k}.json", folder / f"chunk-{k}.idx") for k in range(plan.chunks)
    ]


def route(path: Path, plan: Plan, folder: Path, range_bytes: int, progress: Share) -> list[Chunk]:
    """Copy each event of `path` to its chunk's file under `folder`, as its route key (written
    by the first pass) says."""
    chunks = chunks_of(plan, folder)
    writers = ChunkWriters(chunks, _head(plan))
    route_span(path, plan, 0, len(plan.spans), writers, range_bytes, progress)
    writers.close(TAIL)
    return chunks


def route_span(
    path: Path,
    plan: Plan,
    first: int,
    last: int,
    writers: ChunkWriters,
    range_bytes: int,
    progress: Share,
) -> None:
    """Route the events of the plan's spans `first` to `last` (excluded). A plain file goes by
    the first pass's ranges: a range whose events all go to one chunk is copied as it lies
    (most are: a chunk is many ranges), the others split into events' texts; a gzip file is
    split whole."""
    f, gz = open_stream(path)
    done = [sum(plan.span_events[:first])]
    end, total = sum(plan.span_events[:last]), max(1, path.stat().st_size)

    def split_by(keys: list[BinaryIO]) -> Callable[[list[msgspec.Raw]], None]:
        def split(raws: list[msgspec.Raw]) -> None:
            key = _read_keys(keys, len(raws))
            if key.size != len(raws):
                raise RangeError("the trace changed since it was read")
            _write_range(plan, _chunk_of_events(plan, key), raws, done[0], writers)
            done[0] += key.size
            progress(done[0] / max(1, plan.events), done[0])

        return split

    with f, ExitStack() as stack:
        try:
            if plan.ranges is None:  # gzip, or an array-form file: split as a stream
                keys: list[BinaryIO] = [
                    stack.enter_context(k.open("rb")) for k in plan.keys[first:last]
                ]
                decode_span(StreamSource(f, path, gzip=gz), None, None, range_bytes=range_bytes,
                            path=path, raw=split_by(keys))  # fmt: skip
            else:
                source = FileSource(f.fileno(), total)
                for span in range(first, last):
                    with plan.keys[span].open("rb") as keys_file:
                        for lo, hi, count in plan.ranges[span].tolist():
                            key = _read_keys([keys_file], count)
                            if key.size != count:
                                raise RangeError("the trace changed since it was read")
                            chunk = _chunk_of_events(plan, key)
                            if (
                                lo >= 0
                                and hi >= 0
                                and count
                                and chunk[0] >= 0
                                and (chunk == chunk[0]).all()
                            ):
                                # whole events and the commas between: after the range's
                                # first cut, before its last
                                index = np.arange(done[0], done[0] + count, dtype=np.int64)
                                writers.copy(int(chunk[0]), f.fileno(), lo + 1, hi, index)
                                done[0] += count
                                continue
                            # split into events (the file's first and last ranges always:
                            # the top-level keys lie beside their events)
                            keys_file.seek(-key.nbytes, os.SEEK_CUR)
                            decode_span(source, None if lo < 0 else lo, None if hi < 0 else hi,
                                        range_bytes=range_bytes, path=path,
                                        raw=split_by([keys_file]))  # fmt: skip
                    progress(done[0] / max(1, plan.events), done[0])
        except RangeError as e:  # not expected: the first pass decoded the same ranges
            raise BadInputError(path, f"invalid JSON ({e})") from None
    if done[0] != end:
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


def join_parts(chunks: list[Chunk], plan: Plan, started: list[list[bool]]) -> None:
    """Each chunk's file from the spans' parts of it (`started[span][chunk]`: a part has
    events), copied in the kernel; the parts removed as they are used."""
    head = _head(plan)
    for k, chunk in enumerate(chunks):
        parts = [i for i, s in enumerate(started) if s[k]]
        for target, between, ends in (
            (chunk.path, b",\n", (head, TAIL)),
            (chunk.index_path, b"", (b"", b"")),
        ):
            # written through the descriptor, not opened for appending: copy_file_range
            # refuses a file opened with O_APPEND
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(out, ends[0])
                for n, i in enumerate(parts):
                    _write_all(out, between if n else b"")
                    part = Path(f"{target}.part{i}")
                    with part.open("rb") as src:
                        _copy_all(src.fileno(), out, part.stat().st_size)
                _write_all(out, ends[1])
            finally:
                os.close(out)
            for i in range(len(started)):
                Path(f"{target}.part{i}").unlink(missing_ok=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view.nbytes:
        view = view[os.write(fd, view) :]


def _copy_all(src: int, dst: int, size: int, at: int | None = None) -> None:
    """`size` bytes of `src` (from `at`, else its position) to `dst`'s position."""
    while size:
        n = os.copy_file_range(src, dst, size, at)
        if n == 0:
            raise RangeError("the trace changed since it was read")
        size -= n
        at = None if at is None else at + n


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


def _write_range(
    plan: Plan, chunk: np.ndarray, raws: list[msgspec.Raw], first: int, writers: ChunkWriters
) -> None:
    index = np.arange(first, first + chunk.size, dtype=np.int64)
    order = np.argsort(chunk, kind="stable")  # each chunk's events in the trace's order
    every = order[: np.searchsorted(chunk[order], 0)]
    bounds = np.searchsorted(chunk[order], np.arange(plan.chunks + 1))
    if (
        chunk.size
        and not every.size
        and bounds[chunk[0]] == 0
        and bounds[chunk[0] + 1] == chunk.size
    ):
        writers.write(int(chunk[0]), raws, index)  # the whole range to one chunk, mostly
        return
    for k in np.flatnonzero(np.diff(bounds)).tolist() if not every.size else range(plan.chunks):
        mine = order[bounds[k] : bounds[k + 1]]  # in the trace's order (a stable sort's)
        if every.size:
            mine = np.sort(np.concatenate([every, mine]))
        writers.write(k, [raws[i] for i in mine.tolist()], index[mine])


def _head(plan: Plan) -> bytes:
    """The text of a chunk before its events: the trace's top-level keys first, as Kineto
    writes them (`"key":value,` each), then the array."""
    keys = {k: v for k, v in plan.top.items() if v is not None}
    return (
        b"{"
        + b"".join(
            msgspec.json.encode(k) + b":" + msgspec.json.encode(v) + b"," for k, v in keys.items()
        )
        + b'"traceEvents":[\n'
    )


TAIL = b"\n]}"


def chunk_folder() -> tempfile.TemporaryDirectory:
    """Where the chunks' files go: $NEURON_EXPLORER_SPILL_DIR, else the system's temporary
    folder."""
    from .kineto_spill import spill_directory

    return tempfile.TemporaryDirectory(prefix="neuron-explorer-chunks-", dir=spill_directory())

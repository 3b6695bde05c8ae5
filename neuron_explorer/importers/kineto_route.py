"""The chunked import's second pass: each event's own bytes copied to its chunk's trace file
(kineto_plan says which), so that each chunk is a trace the in-memory mapping imports as it is.

Every chunk file has the trace's top-level keys and all its metadata events (they name the
lanes), and a sidecar of the trace-wide index of each of its events, which orders rows that tie
on (start, duration) across chunks as the trace's own order does.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec
import numpy as np

from ..errors import BadInputError
from .kineto_plan import COUNTER, METADATA, ROUTE_KEY, Plan
from .kineto_ranges import RangeError, decode_span
from .kineto_stream import StreamSource, open_stream
from .progress import Share


@dataclass(frozen=True)
class Chunk:
    """One chunk's trace file and the trace-wide index of each of its events (in its order)."""

    path: Path
    index_path: Path

    def event_index(self) -> np.ndarray:
        return np.fromfile(self.index_path, dtype=np.int64)


class _Writers:
    """The chunks' files, open while the trace is routed."""

    def __init__(self, folder: Path, count: int, top: bytes) -> None:
        self.chunks = [
            Chunk(folder / f"chunk-{k}.json", folder / f"chunk-{k}.idx") for k in range(count)
        ]
        self.text: list[BinaryIO] = [c.path.open("wb") for c in self.chunks]
        self.index: list[BinaryIO] = [c.index_path.open("wb") for c in self.chunks]
        self.started = [False] * count
        for f in self.text:
            f.write(b"{" + top + b'"traceEvents":[\n')  # the keys first, as Kineto writes

    def write(self, k: int, raws: list[bytes], index: np.ndarray) -> None:
        if not raws:
            return
        self.text[k].write((b",\n" if self.started[k] else b"") + b",\n".join(raws))
        self.started[k] = True
        index.astype(np.int64).tofile(self.index[k])

    def close(self) -> list[Chunk]:
        for f in self.text:
            f.write(b"\n]}")
            f.close()
        for f in self.index:
            f.close()
        return self.chunks


def route(path: Path, plan: Plan, folder: Path, range_bytes: int, progress: Share) -> list[Chunk]:
    """Copy each event of `path` to its chunk's file under `folder`, as its route key (written
    by the first pass) says."""
    f, gz = open_stream(path)
    writers = _Writers(folder, plan.chunks, _top_keys(plan))
    done = [0]
    total = max(1, path.stat().st_size)
    with f, plan.keys.open("rb") as keys:
        source = StreamSource(f, path, gzip=gz)

        def split(raws: list[msgspec.Raw]) -> None:
            key = np.fromfile(keys, ROUTE_KEY, count=len(raws))
            if key.size != len(raws):
                raise RangeError("the trace changed since it was read")
            _route_range(plan, key, raws, done[0], writers)
            done[0] += key.size
            progress(min(1.0, source.bytes_read / total), done[0])

        try:
            decode_span(source, None, None, range_bytes=range_bytes, path=path, raw=split)
        except RangeError as e:  # not expected: the first pass decoded the same ranges
            raise BadInputError(path, f"invalid JSON ({e})") from None
    if done[0] != plan.events:
        raise BadInputError(path, "the trace changed since it was read")
    return writers.close()


def _route_range(
    plan: Plan, key: np.ndarray, raws: list[msgspec.Raw], first: int, writers: _Writers
) -> None:
    chunk = plan.chunk_of_time(key["ts"])
    dev = np.flatnonzero(key["corr"] >= 0)
    if dev.size:  # device work goes with its launch, when the trace has it
        launched = plan.chunk_of_launch(key["corr"][dev])
        chunk[dev] = np.where(launched >= 0, launched, chunk[dev])
    if plan.samples_first:
        chunk[key["flag"] == COUNTER] = 0
    chunk[key["flag"] == METADATA] = -1  # every chunk's
    index = np.arange(first, first + chunk.size, dtype=np.int64)
    order = np.argsort(chunk, kind="stable")  # each chunk's events in the trace's order
    every = order[: np.searchsorted(chunk[order], 0)]
    bounds = np.searchsorted(chunk[order], np.arange(plan.chunks + 1))
    for k in np.flatnonzero(np.diff(bounds)).tolist() if not every.size else range(plan.chunks):
        mine = np.sort(np.concatenate([every, order[bounds[k] : bounds[k + 1]]]))
        writers.write(k, [bytes(raws[i]) for i in mine.tolist()], index[mine])


def _top_keys(plan: Plan) -> bytes:
    """The trace's top-level keys as the text before its events (`"key":value,` each)."""
    keys = {k: v for k, v in plan.top.items() if v is not None}
    return b"".join(
        msgspec.json.encode(k) + b":" + msgspec.json.encode(v) + b"," for k, v in keys.items()
    )


def chunk_folder() -> tempfile.TemporaryDirectory:
    """Where the chunks' files go: $NEURON_EXPLORER_SPILL_DIR, else the system's temporary
    folder."""
    from .kineto_spill import spill_directory

    return tempfile.TemporaryDirectory(prefix="neuron-explorer-chunks-", dir=spill_directory())

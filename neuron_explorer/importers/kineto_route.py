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
import pyarrow.compute as pc

from ..errors import BadInputError
from .kineto_plan import Plan, piece_roles
from .kineto_ranges import WRAP_KEY, Piece, RangeError, Span, decode_span
from .kineto_stream import StreamSource, open_stream
from .progress import Share


class _HeadEvents(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw]


class _RangeEvents(msgspec.Struct, gc=False):
    events: list[msgspec.Raw] = msgspec.field(name=WRAP_KEY)


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
    """Copy each event of `path` to its chunk's file under `folder`."""
    f, gz = open_stream(path)
    span = Span()
    writers = _Writers(folder, plan.chunks, _top_keys(plan))
    raws: list[list[bytes]] = []
    done = [0]
    total = max(1, path.stat().st_size)
    with f:
        source = StreamSource(f, path, gzip=gz)

        def on_range(view: memoryview, first: bool) -> None:
            events = msgspec.json.decode(view, type=_HeadEvents if first else _RangeEvents)
            raw = events.traceEvents if first else events.events  # type: ignore[union-attr]
            raws.append([bytes(r) for r in raw])  # views of a buffer read over: copied

        def keep(p: Piece) -> None:
            _route_piece(plan, span, p, raws.pop(), done[0], writers)
            done[0] += p.ts.ns.size
            progress(min(1.0, source.bytes_read / total), done[0])

        try:
            decode_span(source, None, None, keep=keep, range_bytes=range_bytes, path=path,
                        span=span, on_range=on_range)  # fmt: skip
        except RangeError as e:  # not expected: the first pass decoded the same ranges
            raise BadInputError(path, f"invalid JSON ({e})") from None
    return writers.close()


def _route_piece(
    plan: Plan, span: Span, p: Piece, raws: list[bytes], first: int, writers: _Writers
) -> None:
    r = piece_roles(span, p)
    ts = np.where(p.ts.missing | p.ts.out_of_range, plan.bounds[0], p.ts.ns)
    chunk = plan.chunk_of_time(ts)
    gpu = np.flatnonzero(r.typed_subsets()["gpu"])  # the events p.typed["gpu"] holds
    dev = r.device[gpu]
    if dev.any():  # device work goes with its launch, when the trace has it
        corr = pc.fill_null(p.typed["gpu"][0], -1).to_numpy(zero_copy_only=False)[dev]
        launched = plan.chunk_of_launch(corr)
        chunk[gpu[dev]] = np.where(launched >= 0, launched, chunk[gpu[dev]])
    if plan.samples_first:
        chunk[r.is_counter] = 0
    phs = span.values["ph"]
    chunk[p.codes["ph"] == (phs.index("M") if "M" in phs else -2)] = -1  # every chunk's
    index = np.arange(first, first + ts.size, dtype=np.int64)
    order = np.argsort(chunk, kind="stable")  # each chunk's events in the trace's order
    every = order[: np.searchsorted(chunk[order], 0)]
    bounds = np.searchsorted(chunk[order], np.arange(plan.chunks + 1))
    for k in np.flatnonzero(np.diff(bounds)).tolist() if not every.size else range(plan.chunks):
        mine = np.sort(np.concatenate([every, order[bounds[k] : bounds[k + 1]]]))
        writers.write(k, [raws[i] for i in mine.tolist()], index[mine])


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

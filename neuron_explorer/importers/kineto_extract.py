"""A trace file to columns: decoded range by range (kineto_ranges), a large file in several
processes (kineto_parallel), and the whole file at once for anything the ranges cannot decode,
so a bad file gets the same one-line error whichever way it went."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import BadInputError
from . import kineto_decode as kd
from . import kineto_parallel as parallel
from .kineto_frames import compact
from .kineto_ranges import (
    FIELDS,
    RANGE_BYTES,
    BufferSource,
    FileSource,
    Piece,
    RangeError,
    Source,
    Span,
    decode_span,
    phases,
)
from .kineto_spill import SpilledText
from .progress import Share, no_share

MAX_WORKERS = 4
PARALLEL_MIN_BYTES = 24 << 20  # below this a second process costs more than it saves


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: processes (None: one per CPU, up to MAX_WORKERS), range size, smallest
    file decoded in several processes; with a memory budget, one forward pass instead."""

    workers: int | None = None
    range_bytes: int = RANGE_BYTES
    parallel_min_bytes: int = PARALLEL_MIN_BYTES
    memory_budget: int | None = None  # bytes: read the file as a stream (kineto_columns)
    chunk_budget: int | None = None  # bytes a chunk's mapping may take (kineto_chunked; tests)
    stream_range_bytes: int | None = None  # a memory budget's ranges (None: the budget's size)


@dataclass
class Decoded:
    """A trace's events as columns (codes into distinct values) plus the top-level keys."""

    n: int
    ph: np.ndarray  # fixed-width str array (no Python objects kept)
    name_code: np.ndarray
    names: pa.Array  # distinct names (strings)
    name_list: list[str]
    cat_code: np.ndarray
    cats: list[str]
    pid_code: np.ndarray
    pids: pa.Array  # distinct pids as text
    tid_code: np.ndarray
    tids: pa.Array
    id_code: np.ndarray
    ids: pa.Array
    ts: kd.Times
    dur: kd.Times
    row_args: pa.Array | SpilledText  # args JSON text of the events that are rows (kinds.Roles)
    typed: dict[str, tuple[pa.ChunkedArray, ...]]  # kineto_args.SUBSETS -> columns
    trace: kd.Trace  # top-level keys, traceEvents empty

    def take_row_args(self) -> pa.Array | SpilledText:
        """The args texts, no longer held here (they go to the events table's column)."""
        texts, self.row_args = self.row_args, None  # type: ignore[assignment]
        return texts

    def let_go_times(self) -> None:
        """Drop the events' times once the rows have theirs (kineto._rows)."""
        none = np.zeros(0, bool)
        self.ts = self.dur = kd.Times(np.zeros(0, np.int64), none, none)

    def let_go_events(self) -> None:
        """Drop the per-event columns (phase, codes, times) and the typed columns the rows no
        longer need, once the mapping has read what it needs from them (kineto.load): the
        distinct values, the op and gpu args and the args texts stay."""
        empty = np.zeros(0, np.int32)
        self.ph = np.zeros(0, self.ph.dtype)
        self.name_code = self.cat_code = self.pid_code = self.tid_code = self.id_code = empty
        none = np.zeros(0, bool)
        self.ts = self.dur = kd.Times(np.zeros(0, np.int64), none, none)
        self.typed = {k: v for k, v in self.typed.items() if k in ("op", "gpu")}


def extract(
    path: Path,
    options: DecodeOptions = DecodeOptions(),
    progress: Share = no_share,
) -> Decoded:
    """Read and decode a trace file into columns (`progress`: the share decoded)."""
    try:
        with path.open("rb") as f:
            head = f.read(kd.HEAD_BYTES)
            if head.startswith(kd.GZIP_MAGIC) or head.lstrip().startswith(b"["):
                source: Source = BufferSource(kd.as_trace_object(kd.read_bytes(path)))
                return _merge(_spans(path, source, options, progress))
            fd = os.dup(f.fileno())
    except OSError as e:
        raise BadInputError(path, f"cannot read ({e.strerror or e})") from None
    try:
        return _merge(_spans(path, FileSource(fd, os.fstat(fd).st_size), options, progress))
    finally:
        os.close(fd)


def _spans(
    path: Path, source: Source, options: DecodeOptions, progress: Callable[[float], None]
) -> list[Span]:
    """Decode in processes, else in ranges here, else the whole file at once (the usual error
    for a bad file)."""
    workers = _workers(source, options)
    cut_at = parallel.cuts(source, workers) if workers > 1 else []
    if cut_at:
        try:
            return parallel.decode_spans(source, cut_at, options.range_bytes, progress)
        except RangeError:
            pass
    try:
        return [
            decode_span(
                source, None, None, range_bytes=options.range_bytes, path=path, progress=progress
            )
        ]
    except RangeError:
        buf = source.buf if isinstance(source, BufferSource) else kd.read_bytes(path)
        whole = BufferSource(buf)
        return [decode_span(whole, None, None, range_bytes=whole.size + 1, path=path)]


def _workers(source: Source, options: DecodeOptions) -> int:
    if source.size < max(options.parallel_min_bytes, 2 * options.range_bytes):
        return 1
    if not parallel.available():
        return 1
    if options.workers is not None:
        return max(1, options.workers)
    return default_workers()


def default_workers() -> int:
    """One process per CPU this process may run on, up to MAX_WORKERS."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_WORKERS, cpus or 1))


def _merge(
    spans: list[Span],
    row_args: SpilledText | None = None,
    joined: Callable[[], None] = lambda: None,
) -> Decoded:
    """The spans' pieces as one set of columns, codes renumbered over all distinct values in
    file order (so the result does not depend on how the file was cut); `row_args`: the args
    texts when they were spilled instead of kept in the pieces. The pieces are emptied as they
    are joined, a column at a time, so the columns are never all held twice (`joined` runs
    after each column: the streaming import hands the pieces' freed heap back there)."""
    factorizers = {f: kd.Factorizer() for f in FIELDS}
    codes: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
    pieces = []
    one = len(spans) == 1  # its codes are already in file order: no second dict of values
    for span in spans:
        remaps = {} if one else {f: factorizers[f].remap(span.values[f]) for f in FIELDS}
        for p in span.pieces:
            for f in FIELDS:
                c = p.codes.pop(f)
                codes[f].append(c if one else remaps[f][c])
            pieces.append(p)
        span.pieces = []
    top: dict = {}
    for span in spans:
        top.update(span.top)
    values = spans[0].values if one else {f: z.seen for f, z in factorizers.items()}

    def join(field: str) -> np.ndarray:
        narrowest = compact(np.array([NONE_CODE, len(values[field]) - 1])).dtype
        out = _fill(codes.pop(field), narrowest)
        joined()
        return out

    def times(attr: str) -> kd.Times:
        parts = [_let_go(p, attr) for p in pieces]
        ns, missing = [t.ns for t in parts], [t.missing for t in parts]
        out_of_range = [t.out_of_range for t in parts]
        del parts
        out = kd.Times(_fill(ns, np.int64), _fill(missing, bool), _fill(out_of_range, bool))
        joined()
        return out

    ph = phases(values["ph"], join("ph"))
    typed_keys = pieces[0].typed.keys()
    return Decoded(
        n=len(ph),
        ph=ph,
        name_code=join("name"),
        names=pa.array(values["name"], pa.string()),
        name_list=values["name"],
        cat_code=join("cat"),
        cats=values["cat"],
        pid_code=join("pid"),
        pids=kd.as_text(values["pid"]),
        tid_code=join("tid"),
        tids=kd.as_text(values["tid"]),
        id_code=join("id"),
        ids=kd.as_text(values["id"]),
        ts=times("ts"),
        dur=times("dur"),
        row_args=row_args if row_args is not None else _concat_text([p.row_args for p in pieces]),
        typed={
            k: tuple(
                _chunked(list(cols)) for cols in zip(*(p.typed[k] for p in pieces), strict=True)
            )
            for k in typed_keys
        },
        trace=kd.Trace(traceEvents=[], **top),
    )


NONE_CODE = -1


def _fill(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """The parts as one array of `dtype`, each part let go once copied (a concatenate would
    hold every part and the whole column at once: the decode's peak, measured at 3 GB)."""
    out = np.empty(sum(len(a) for a in parts), dtype=dtype)
    pos = 0
    for i in range(len(parts)):
        part, parts[i] = parts[i], None  # type: ignore[call-overload]
        out[pos : pos + len(part)] = part
        pos += len(part)
        del part
    return out


def _let_go(piece: Piece, attr: str) -> kd.Times:
    """A piece's times, the piece no longer holding them."""
    times = getattr(piece, attr)
    setattr(piece, attr, None)
    return times


def _concat_text(arrays: list[pa.Array]) -> pa.Array:
    """The pieces' texts as one array, joined now (while memory is low: reordering a chunked
    column later would join them anyway, at the import's peak)."""
    if sum(a.nbytes for a in arrays) >= 2**31 - 1:  # beyond int32 offsets
        arrays = [a.cast(pa.large_string()) for a in arrays]
    return pa.concat_arrays(_chunked(arrays).chunks)


def _chunked(arrays: list[pa.Array]) -> pa.ChunkedArray:
    """One column of the pieces' arrays (text goes large when one piece's is)."""
    types = {a.type for a in arrays}
    if len(types) > 1 and pa.large_string() in types:
        arrays = [a.cast(pa.large_string()) for a in arrays]
    return pa.chunked_array(arrays)

"""A trace's traceEvents array cut into ranges of a few MB at event boundaries, each decoded on
its own and mapped to columns before the next is read: memory stays bounded by a range, the
args come in the same pass as the rest, and the ranges of a span can go to another process
(kineto_parallel).

A cut is the comma between two events (`}` `,` `{`, any whitespace). It is checked, not
trusted: a range is decoded as a JSON object of its own (the range's events wrapped in
`{"<key>":[` and `]}` written over the bytes around its cuts), which succeeds only if each cut
sits between two events at the top level of the array. So when every range decodes, the events
are exactly the file's. A range that fails is tried again with an earlier cut (a string may
hold "}, {"); then RangeError, and the caller decodes the whole file at once, which gives the
usual one-line error for a bad file. A range between two cuts is read by the native scanner
where it is built (kineto_native), which checks the same wrapper and refuses what it does not
read exactly as msgspec does; msgspec decodes the rest (kineto_range_columns).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from . import kineto_decode as kd
from .kineto_range_columns import FIELDS, WRAP_KEY, Piece, columns, phases, scanned
from .kineto_stream import StreamSource

RANGE_BYTES = 8 << 20  # measured: 4-8 MB ranges decode fastest (cache-friendly) and bound memory
WRAP = b'{"' + WRAP_KEY.encode() + b'":['
END = b"]}"
CUT = re.compile(rb"\}\s*,\s*\{")
CUT_WINDOW = 1 << 16  # a cut is looked for in the last 64 KB of a read first
CUT_TRIES = 4  # cuts tried for one range before the caller falls back
TRACE_EVENTS_KEY = b'"traceEvents"'
KEY_SEARCH_BYTES = 64 << 20  # top-level keys written before traceEvents: far less than this


class RangeError(Exception):
    """A range did not decode as events: decode the whole file instead."""


class _Middle(msgspec.Struct, gc=False):
    events: list[kd.Event] = msgspec.field(name=WRAP_KEY)


class _Tail(msgspec.Struct, gc=False):
    """The last range: its events and the top-level keys after the array."""

    events: list[kd.Event] = msgspec.field(name=WRAP_KEY)
    traceEvents: Any = msgspec.UNSET  # a second traceEvents key: the whole-file decode decides
    deviceProperties: list[dict[str, Any]] | msgspec.UnsetType = msgspec.UNSET
    distributedInfo: dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET
    baseTimeNanoseconds: int | None | msgspec.UnsetType = msgspec.UNSET
    schemaVersion: Any = msgspec.UNSET
    traceName: Any = msgspec.UNSET
    displayTimeUnit: Any = msgspec.UNSET
    host_name: Any = msgspec.UNSET


@dataclass
class Span:
    """The decoded events of consecutive ranges: pieces, distinct values, top-level keys."""

    pieces: list[Any] = field(default_factory=list)  # Piece, or what `keep` made of one
    values: dict[str, list[Any]] = field(default_factory=dict)  # FIELDS -> distinct values
    top: dict[str, Any] = field(default_factory=dict)  # top-level keys found in the span
    ends: list[int | None] = field(default_factory=list)  # each range's end cut (None: the end)


class FileSource:
    """A plain file read range by range into one reused buffer (no page faults after the
    first range, nothing of the file kept)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self._buf = bytearray(0)

    def read(self, lo: int, hi: int) -> memoryview:
        if len(self._buf) < hi - lo:
            self._buf = bytearray(max(hi - lo, 2 * RANGE_BYTES))
        view = memoryview(self._buf)[: hi - lo]
        got = 0
        while got < len(view) and (n := os.preadv(self.fd, [view[got:]], lo + got)):
            got += n
        if got < len(view):
            raise RangeError("the file shrank while read")
        return view

    def release(self, before: int) -> None:
        """Nothing to drop: ranges are read into one reused buffer."""


class BufferSource:
    """A trace already in memory (a gunzipped file); ranges are views of it."""

    def __init__(self, buf: bytearray) -> None:
        self.buf, self.size = buf, len(buf)

    def read(self, lo: int, hi: int) -> memoryview:
        return memoryview(self.buf)[lo:hi]

    def release(self, before: int) -> None:
        """Nothing to drop: the trace stays in memory."""


Source = FileSource | BufferSource | StreamSource


def find_cut(source: Source, target: int, end: int) -> int | None:
    """The first cut at or after byte `target` and before `end`, or None."""
    step = 1 << 20
    for lo in range(target, end, step):
        hi = min(lo + step + 64, end)
        m = CUT.search(source.read(lo, hi).tobytes())
        if m:
            return lo + m.start() + m.group().index(b",")
    return None


def decode_span(
    source: Source,
    begin: int | None,
    end: int | None,
    *,
    keep: Callable[[Piece], Any] = lambda p: p,
    range_bytes: int = RANGE_BYTES,
    path: Path | None = None,
    progress: Callable[[float], None] = lambda f: None,
    span: Span | None = None,
    per_range: tuple[str, ...] = (),
) -> Span:
    """Decode the events between cut `begin` (None: the file's start) and cut `end` (None: its
    end), range by range; `keep` turns each range's Piece into what the Span holds, `progress`
    hears the share of the span done. A span that is the whole file in one range decodes as the
    file (BadInputError naming `path`). `span`: the Span to fill, its values (the distinct values
    so far) readable by `keep`. `per_range`: FIELDS whose distinct values are only each
    range's (codes start again at 0; a trace's ids are mostly distinct, and keeping them all
    grows with the trace)."""
    span = span or Span()
    factorizers = {f: kd.Factorizer() for f in FIELDS}
    span.values = {f: z.seen for f, z in factorizers.items()}  # the lists grow as ranges come
    pos = begin
    limit = source.size if end is None else end + len(END)
    while True:
        for f in per_range:
            factorizers[f] = kd.Factorizer()
            span.values[f] = factorizers[f].seen
        lo = 0 if pos is None else pos - len(WRAP) + 1
        source.release(lo)
        first = _events_key(source, range_bytes) if pos is None else lo
        cut = _next_cut(source, lo, first, limit, end, range_bytes)
        for attempt in range(CUT_TRIES):
            hi = source.size if cut is None else cut + len(END)
            view = source.read(lo, hi)
            patches = _patch(view, first=pos is None, last=cut is None, size=hi - lo)
            try:
                piece = None
                if pos is not None and cut is not None:  # a middle range: no top-level keys
                    piece = scanned(view, factorizers)
                if piece is None:
                    evs, top = _decode(view, first=pos is None, last=cut is None, path=path)
                    span.top.update(top)
                    piece = columns(evs, view, pos is None, factorizers)
                    del evs
                span.pieces.append(keep(piece))
                del piece
                break
            except RangeError as e:
                # the range's start is sound (the previous range ended there); a cut we chose
                # may sit in a string that holds "}, {": try the one before it
                earlier = None
                if cut is not None and cut != end:
                    earlier = _last_cut(source, lo + len(WRAP), cut)
                if earlier is None or attempt == CUT_TRIES - 1:
                    raise RangeError(_in_file(str(e), lo)) from None
                cut = earlier
            finally:
                for at, saved in patches:  # a buffer source's bytes are the file's: restore
                    view[at : at + len(saved)] = saved
        span.ends.append(cut)
        if cut is None or cut == end:
            break
        pos = cut
        progress((cut - (begin or 0)) / (min(limit, source.size) - (begin or 0)))
    return span


def _events_key(source: Source, range_bytes: int) -> int:
    """Where the traceEvents key is in the file (0 if not found in its first KEY_SEARCH_BYTES:
    a stream holds what it searched): the first range's cut goes after it, not between the
    objects of a key written before it (deviceProperties, distributedInfo's pg_config)."""
    step = max(range_bytes, 1 << 16)
    for lo in range(0, min(source.size, KEY_SEARCH_BYTES), step):
        window = source.read(lo, min(lo + step + len(TRACE_EVENTS_KEY), source.size)).tobytes()
        at = window.find(TRACE_EVENTS_KEY)
        if at >= 0:
            return lo + at
        if not window:
            break
    return 0


_BYTE = re.compile(r"\(byte (\d+)\)")


def _in_file(message: str, lo: int) -> str:
    """A decoder's message about a range, its "(byte N)" made the byte of the whole text."""
    return _BYTE.sub(lambda m: f"(byte {lo + int(m.group(1))})", message)


def _next_cut(
    source: Source, lo: int, first: int, limit: int, end: int | None, range_bytes: int
) -> int | None:
    """Where the range starting at `lo` ends: the last cut after `first` (where its events
    begin) before `lo + range_bytes` (further for an event longer than that), or the span's
    end when that is near."""
    size = max(range_bytes, first - lo + range_bytes // 2)
    while lo + size + range_bytes // 2 < min(limit, source.size):  # a stream's size is known late
        start = max(first, lo + len(WRAP))  # after the range's own first event start
        cut = _last_cut(source, max(start, lo + size - CUT_WINDOW), lo + size)
        if cut is None and lo + size - CUT_WINDOW > start:
            cut = _last_cut(source, start, lo + size)
        if cut is not None:
            return cut
        size *= 2
    return end


def _last_cut(source: Source, lo: int, hi: int) -> int | None:
    last = None
    for last in CUT.finditer(source.read(lo, hi).tobytes()):  # noqa: B007 - the last one
        pass
    return None if last is None else lo + last.start() + last.group().index(b",")


def _patch(view: memoryview, *, first: bool, last: bool, size: int) -> list[tuple[int, bytes]]:
    """Write the wrapper over the range's cuts; returns what was there."""
    saved = []
    if not first:
        saved.append((0, view[: len(WRAP)].tobytes()))
        view[: len(WRAP)] = WRAP
    if not last:
        saved.append((size - len(END), view[size - len(END) :].tobytes()))
        view[size - len(END) :] = END
    return saved


def _decode(
    view: memoryview, *, first: bool, last: bool, path: Path | None
) -> tuple[list[kd.Event], dict]:
    """Decode a range: the first with the file's top-level keys before the array, the last
    with those after it; the whole file as the file."""
    if first and last:
        whole = kd.decode(path or Path("trace"), view)
        return whole.traceEvents, {k: getattr(whole, k) for k in kd.TOP_KEYS}
    try:
        if first:
            head = msgspec.json.decode(view, type=kd.Trace)
            top = {k: getattr(head, k) for k in kd.TOP_KEYS}
            return head.traceEvents, top
        if not last:
            return msgspec.json.decode(view, type=_Middle).events, {}
        tail = msgspec.json.decode(view, type=_Tail)
    except (msgspec.DecodeError, RecursionError) as e:  # ValidationError is a DecodeError
        raise RangeError(str(e)) from None
    if tail.traceEvents is not msgspec.UNSET:
        raise RangeError("a second traceEvents key")
    top = {k: getattr(tail, k) for k in kd.TOP_KEYS}
    return tail.events, {k: v for k, v in top.items() if v is not msgspec.UNSET}


__all__ = ["FIELDS", "WRAP_KEY", "Piece", "phases"]  # here for the modules that read them here

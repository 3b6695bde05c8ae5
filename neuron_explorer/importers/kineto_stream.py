"""A trace file read forward once, plain or gzip, through a window of bounded size: the
streaming import's source for kineto_ranges.decode_span, which cuts and decodes it range by
range as for a file on disk, so the events are checked the same way and decode to the same
columns.

Only the bytes of the range being decoded (and what was read past it to find its end) are
held: decode_span `release`s each range's start, and the window drops what lies before it.
A gzip file is decompressed as it is read (multi-member files included), never whole. A trace
written as a top-level array of events (`[...]`, the closing `]` optional) is read as
`{"traceEvents": [...]}`, as kineto_decode.as_trace_object rewrites it in memory.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import BinaryIO

from ..errors import BadInputError
from . import kineto_decode as kd

UNKNOWN_SIZE = 1 << 62  # the size reported until the end of a gzip stream is reached
MIN_READ = 1 << 20  # bytes read from the file at a time


class StreamSource:
    """A forward-only Source (kineto_ranges) over an open trace file."""

    def __init__(self, f: BinaryIO, path: Path, *, gzip: bool) -> None:
        self.path, self._f = path, f
        self._z = zlib.decompressobj(wbits=31) if gzip else None
        self._buf = bytearray()
        self._pending = b""  # compressed input not yet decompressed
        self._base = 0  # the absolute offset of _buf[0]
        self._release = 0  # bytes before this are not read again
        self._eof = False
        self._started = False
        self._array = False  # a top-level array of events, read as an object
        self.bytes_read = 0  # of the file on disk (compressed, for gzip): for progress
        self.largest_window = 0  # bytes held at once: what the stream bounds

    @property
    def size(self) -> int:
        """The stream's size once its end has been read; a bound above it until then."""
        return self._base + len(self._buf) if self._eof else UNKNOWN_SIZE

    @property
    def file_offsets(self) -> bool:
        """Whether its byte offsets are the file's: plain text not rewritten (no gzip, no
        top-level array read as an object)."""
        return self._z is None and not self._array

    def release(self, before: int) -> None:
        """Bytes before `before` will not be read again."""
        self._release = max(self._release, before)

    def read(self, lo: int, hi: int) -> memoryview:
        """The bytes [lo, hi) (fewer at the end of the stream)."""
        if lo < self._base:
            raise AssertionError(f"stream read at {lo}, before its window at {self._base}")
        if self._base + len(self._buf) < hi and not self._eof:
            self._fill(hi)
        end = min(hi, self._base + len(self._buf))
        return memoryview(self._buf)[lo - self._base : max(lo, end) - self._base]

    def _fill(self, hi: int) -> None:
        """Read on to byte `hi` into a new buffer that starts at the released point (a new one:
        views of the old buffer may still be alive)."""
        keep = max(0, min(self._release, self._base + len(self._buf)) - self._base)
        buf = bytearray(memoryview(self._buf)[keep:])  # one copy (a slice would be two)
        self._base += keep
        step = max(MIN_READ, hi - self._base - len(buf))
        while self._base + len(buf) < hi and not self._eof:
            chunk = self._next_chunk(step)
            if chunk is None:
                self._eof = True
                self._finish(buf)
            else:
                buf += chunk
        self._buf = buf
        self.largest_window = max(self.largest_window, len(buf))

    def _next_chunk(self, step: int) -> bytes | None:
        """The next `step` decoded bytes at most (possibly none), None at the end of the file."""
        if self._z is not None and self._pending:
            return self._started_data(self._gunzip(step))
        try:
            raw = self._f.read(step)
        except OSError as e:
            raise BadInputError(self.path, f"cannot read ({e.strerror or e})") from None
        self.bytes_read += len(raw)
        if not raw:
            if self._z is not None and not self._z.eof:
                raise BadInputError(self.path, "truncated gzip file (unexpected end of data)")
            return None
        if self._z is None:
            return self._started_data(raw)
        self._pending = raw
        return self._started_data(self._gunzip(step))

    def _started_data(self, data: bytes) -> bytes:
        return data if self._started else self._start(data)

    def _gunzip(self, most: int) -> bytes:
        """Decompress at most `most` bytes of the pending compressed input (a gzip can expand
        a hundredfold: a read's whole output would not be bounded)."""
        assert self._z is not None
        try:
            if self._z.eof:  # a multi-member gzip: go on with the next member
                self._z = zlib.decompressobj(wbits=31)
            out = self._z.decompress(self._pending, most)
            self._pending = self._z.unused_data if self._z.eof else self._z.unconsumed_tail
        except zlib.error as e:
            raise BadInputError(self.path, f"corrupt gzip data ({e})") from None
        return out

    def _start(self, data: bytes) -> bytes:
        """At the first text: a top-level array becomes an object holding it."""
        head = data.lstrip()
        if not head:
            return b""  # only whitespace so far: decide on the next chunk
        self._started = True
        if head.startswith(b"["):
            self._array = True
            return kd.ARRAY_KEY + head
        return data

    def _finish(self, buf: bytearray) -> None:
        """At the end of the text: close an array-form trace the way as_trace_object does."""
        if not self._array:
            return
        while buf and buf[-1:].isspace():
            del buf[-1:]
        if not buf.endswith(b"]"):
            if buf.endswith(b","):
                del buf[-1:]
            buf += b"]"
        buf += b"}"


def open_stream(path: Path) -> tuple[BinaryIO, bool]:
    """The file opened for reading and whether it is gzip (one line naming it if unreadable)."""
    try:
        f = path.open("rb")
        gz = f.read(2) == kd.GZIP_MAGIC
        f.seek(0)
    except OSError as e:
        raise BadInputError(path, f"cannot read ({e.strerror or e})") from None
    return f, gz

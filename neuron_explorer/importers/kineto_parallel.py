"""Decoding a large trace in several processes: the file is cut into spans at event boundaries;
this process decodes the first span while forked children decode the others. A child puts
each range's columns into a memfd as soon as they are made (pickle protocol 5, buffers out of
band) and at the end sends the small rest through a pipe; this process reads the buffers back
last first, shortening the memfd behind it, so neither side ever holds the columns twice and a
child holds no more than one range at a time.

Any failure of a child (a range that does not decode, a crash, a kill) is a RangeError: the
caller then decodes the whole file in this process, which gives the usual one-line error for a
bad file and a correct import otherwise.
"""

from __future__ import annotations

import os
import pickle
import signal
import warnings
from collections.abc import Callable
from typing import Any

from .kineto_ranges import Piece, RangeError, Source, Span, decode_span, find_cut

ALIGN = 64  # Arrow's buffer alignment


def available() -> bool:
    """fork and memfd_create: Linux."""
    return hasattr(os, "fork") and hasattr(os, "memfd_create")


PARENT_SHARE = 0.8  # of a child's: this process also reads the children's columns back, merges


def cuts(source: Source, parts: int, parent_share: float = PARENT_SHARE) -> list[int]:
    """Event boundaries that split the file into `parts` spans, this process's `parent_share`
    of another's (fewer cuts if the events are too long)."""
    found: list[int] = []
    total = parent_share + parts - 1
    for i in range(1, parts):
        start = max(
            found[-1] + 1 if found else 0, int(source.size * (parent_share + i - 1) / total)
        )
        cut = find_cut(source, start, source.size)
        if cut is None:
            break
        found.append(cut)
    return found


def decode_spans(
    source: Source,
    cut_at: list[int],
    range_bytes: int,
    progress: Callable[[float], None] = lambda f: None,
) -> list[Span]:
    """The spans between `cut_at` decoded: the first here (its `progress` reported), the
    others in forked children."""
    ends: list[int | None] = [*cut_at[1:], None]
    children = []
    try:
        for begin, end in zip(cut_at, ends, strict=True):
            children.append(_Child(source, begin, end, range_bytes))
        spans = [decode_span(source, None, cut_at[0], range_bytes=range_bytes, progress=progress)]
        spans += [c.result() for c in children]
        return spans
    finally:
        for c in children:
            c.close()


class _Child:
    """A forked process decoding one span into a memfd."""

    def __init__(self, source: Source, begin: int, end: int | None, range_bytes: int) -> None:
        self.pid, self.pipe, self.memfd, write_end = 0, -1, -1, -1
        try:
            self.memfd = os.memfd_create("neuron-explorer-import", os.MFD_CLOEXEC)
            self.pipe, write_end = os.pipe()
            with warnings.catch_warnings():  # Python 3.12+ warns of fork in a threaded process
                warnings.simplefilter("ignore", DeprecationWarning)
                self.pid = os.fork()
        except OSError as e:  # out of processes or memory: decode here instead
            if write_end >= 0:
                os.close(write_end)
            self.close()
            raise RangeError(f"cannot start a decoding process ({e})") from None
        if self.pid == 0:  # the child: never returns
            os.close(self.pipe)
            _child_main(source, begin, end, range_bytes, self.memfd, write_end)
        os.close(write_end)

    def result(self) -> Span:
        """The child's span, its columns mapped from the memfd; RangeError if it failed."""
        data = _read_all(self.pipe)
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        if status != 0 or not data:
            raise RangeError("a decoding process failed")
        records, span = pickle.loads(data)
        pieces = []
        for inband, spans in reversed(records):  # last first, the memfd shrinking behind
            buffers = [_pread_all(self.memfd, a, b) for a, b in spans]
            pieces.append(pickle.loads(inband, buffers=buffers))
            if spans:
                os.ftruncate(self.memfd, spans[0][0])
        span.pieces = pieces[::-1]
        return span

    def close(self) -> None:
        if self.pid:  # still running (this process is failing): stop it
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = 0
        for fd in (self.pipe, self.memfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.pipe = self.memfd = -1


def _child_main(
    source: Source, begin: int, end: int | None, range_bytes: int, memfd: int, pipe: int
) -> None:
    """Decode, spill each range into the memfd, send the rest; exit without Python's cleanup
    (the parent's atexit handlers and buffers are not the child's)."""
    code = 1
    try:
        spill = _Spill(memfd)
        span = decode_span(source, begin, end, keep=spill.put, range_bytes=range_bytes)
        records, span.pieces = span.pieces, []
        _write_all(pipe, pickle.dumps((records, span), protocol=5))
        code = 0
    except BaseException:  # noqa: BLE001 - any failure is reported by the exit status
        pass
    finally:
        os._exit(code)


class _Spill:
    """Writes a Piece's buffers to the end of the memfd; keeps the small in-band pickle."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pos = fd, 0

    def put(self, piece: Piece) -> tuple[bytes, list[tuple[int, int]]]:
        buffers: list[pickle.PickleBuffer] = []
        inband = pickle.dumps(piece, protocol=5, buffer_callback=buffers.append)
        spans = []
        for b in buffers:
            raw = b.raw()
            self.pos += -self.pos % ALIGN
            _pwrite_all(self.fd, raw, self.pos)
            spans.append((self.pos, self.pos + raw.nbytes))
            self.pos += raw.nbytes
        return inband, spans


def _pwrite_all(fd: int, data: Any, pos: int) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n


def _pread_all(fd: int, start: int, end: int) -> bytearray:
    buf = bytearray(end - start)
    view, got = memoryview(buf), 0
    while got < len(buf):
        n = os.preadv(fd, [view[got:]], start + got)
        if n == 0:
            raise RangeError("a decoding process's output is short")
        got += n
    return buf


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view.nbytes:
        view = view[os.write(fd, view) :]


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)

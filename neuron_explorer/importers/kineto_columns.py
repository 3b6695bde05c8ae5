"""The streaming import's decode: the trace read forward once (kineto_stream), cut and decoded
range by range as the in-memory import does (kineto_ranges.decode_span), each range's columns
made compact as they come (codes narrowed to int32, the args texts spilled to disk by
kineto_spill), then merged into the same Decoded the in-memory import maps. What stays in
memory is a few dozen bytes per event, never the file's text.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from ..errors import BadInputError
from . import kineto_decode as kd
from .kineto_extract import Decoded, _merge
from .kineto_frames import compact
from .kineto_ranges import RANGE_BYTES, Piece, RangeError, decode_span
from .kineto_spill import TextSpill, spill_directory
from .kineto_stream import StreamSource, open_stream
from .progress import Share, no_share

MIN_RANGE_BYTES = 4 << 10
TRIM_BYTES = 64 << 20  # of the file read between two returns of the freed heap to the OS
# the budget over the range size. A range's decoded event objects fill the interpreter's memory
# arenas; a few objects that outlive the range keep most of them from the OS, so the process
# holds about one range's objects for good: 2 MB ranges (the default budget) hold less than
# 8 MB ones (1 GB benchmark trace: peak 589 MB against 603, the same CPU time)
BUDGET_PER_RANGE = 1024


def range_bytes_for(budget: int) -> int:
    """The range size a memory budget allows (the in-memory import's size at most)."""
    return max(MIN_RANGE_BYTES, min(RANGE_BYTES, budget // BUDGET_PER_RANGE))


def stream_extract(
    path: Path, budget: int, progress: Share = no_share, range_bytes: int | None = None
) -> Decoded:
    """Read and decode a trace file forward once, with bounded buffers; the args texts stay on
    disk (`progress`: the share of the file read; `range_bytes`: the ranges' size, else the
    budget's). A file the ranges cannot decode (invalid, or cut points that do not hold) is
    decoded whole when the budget allows it, which gives the in-memory import's one-line error
    or its columns; otherwise it is one line."""
    try:
        return _stream_extract(path, range_bytes or range_bytes_for(budget), progress)
    except RangeError as e:
        if _text_bytes(path) * WHOLE_FILE_FACTOR > budget:
            raise BadInputError(path, f"invalid JSON or not a torch.profiler trace ({e})") from None
    try:
        return _stream_extract(path, WHOLE_FILE_RANGE, progress)
    except RangeError as e:  # not expected: a whole file is decoded as the file
        raise BadInputError(path, f"invalid JSON ({e})") from None


WHOLE_FILE_FACTOR = 8  # a trace decoded whole holds about this many times its text
WHOLE_FILE_RANGE = 1 << 62


def _text_bytes(path: Path) -> int:
    """The file's size, a gzip file's decompressed size taken as ten times it."""
    f, gz = open_stream(path)
    f.close()
    return path.stat().st_size * (10 if gz else 1)


def _stream_extract(path: Path, range_bytes: int, progress: Share) -> Decoded:
    f, gz = open_stream(path)
    with f:
        total = max(1, path.stat().st_size)
        source = StreamSource(f, path, gzip=gz)
        if not bytes(source.read(0, kd.HEAD_BYTES)).strip() and source.size == 0:
            raise BadInputError(path, "empty file")
        spill = TextSpill(spill_directory())
        events, trimmed = 0, 0

        def keep(piece: Piece) -> Piece:
            spill.append(piece.row_args)  # type: ignore[arg-type]
            piece.row_args = None  # type: ignore[assignment]
            nonlocal events, trimmed
            piece.codes = {k: compact(v) for k, v in piece.codes.items()}  # until the merge
            events += len(piece.codes["ph"])
            progress(min(1.0, source.bytes_read / total), events)
            if source.bytes_read - trimmed >= TRIM_BYTES:
                give_back_free_memory()
                trimmed = source.bytes_read
            return piece

        try:
            span = decode_span(source, None, None, keep=keep, range_bytes=range_bytes, path=path)
        except BaseException:
            spill.finish().close()
            raise
    decoded = _merge([span], row_args=spill.finish(), joined=give_back_free_memory)
    give_back_free_memory()
    return decoded


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
OWN_MAPPING_BYTES = 1 << 20  # blocks this large or larger get a mapping of their own


def map_large_blocks(own_mapping_bytes: int = OWN_MAPPING_BYTES) -> None:
    """Have glibc's malloc give every block of `own_mapping_bytes` or more a mapping of its own,
    handed back to the OS when it is freed. By default the threshold rises to the size of the
    largest such block freed (up to 32 MB), so the mapping's per-row temporaries (4 to 8 bytes
    a row: under 32 MB up to four million rows) land on the heap, and once freed they stay in
    the process until a trim: 139 MB of the 379 MB held after mapping the 300 MB benchmark
    trace. The setting is the process's from then on (a fixed threshold, as glibc documents)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(M_MMAP_THRESHOLD, own_mapping_bytes)


def give_back_free_memory() -> None:
    """Return the C heap's free pages to the OS (glibc's malloc_trim): the ranges' decoded
    objects, freed between the columns kept, leave a heap the size of a third of the columns
    that glibc would otherwise hold through the mapping (330 MB of 1 GB measured on the 1 GB
    benchmark trace)."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)

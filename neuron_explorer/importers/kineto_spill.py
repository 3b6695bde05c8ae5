"""The events' args texts kept on disk while a streaming import maps the trace: appended to
an unnamed temporary file range by range as the ranges are decoded, read back by rows through
a memory map when the events table is written, a row group at a time.

The args are the largest part of a decoded trace that the mapping never looks into (it reads
the few typed fields kineto_args pulls out), so they need not be in memory: the map's pages
are dropped again after each block (MADV_DONTNEED; the file stays in the page cache, not in
this process's memory).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa


class TextSpill:
    """Texts (null or not) appended in order, each a row; `take` reads rows back as Arrow.
    The texts' end offsets and validity go to files of their own as they come: a row's
    offset in memory would be 8 bytes a row held through the whole import."""

    def __init__(self, directory: str | None = None) -> None:
        self._file = tempfile.TemporaryFile(dir=directory)
        self._starts = tempfile.TemporaryFile(dir=directory)
        self._valid = tempfile.TemporaryFile(dir=directory)
        self._starts.write(np.zeros(1, np.int64).tobytes())
        self._size = self._rows = 0

    def append(self, texts: pa.Array) -> None:
        """Spill one piece's texts (a string array)."""
        offsets: np.ndarray = np.frombuffer(texts.buffers()[1], dtype=_offset_type(texts))
        offsets = offsets[texts.offset : texts.offset + len(texts) + 1]
        data = texts.buffers()[2]
        if data is not None and offsets[-1] > offsets[0]:
            self._file.write(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
        ends = offsets[1:].astype(np.int64)
        ends += self._size - int(offsets[0])
        self._starts.write(ends.tobytes())
        self._valid.write(texts.is_valid().to_numpy(zero_copy_only=False).tobytes())
        self._size += int(offsets[-1] - offsets[0])
        self._rows += len(texts)

    def finish(self) -> SpilledText:
        """The spilled texts as one column to read rows from."""
        for f in (self._file, self._starts, self._valid):
            f.flush()
        self._valid.seek(0)
        valid = np.fromfile(self._valid, dtype=bool, count=self._rows)
        self._valid.close()
        return SpilledText(self._file, self._starts, valid, self._size)


def _offset_type(texts: pa.Array) -> type:
    return np.int64 if pa.types.is_large_string(texts.type) else np.int32


class SpilledText:
    """A text column on disk: `take(rows)` as an Arrow string array, `text(i)` one value. The
    column is an Arrow array whose data buffer is the memory map, so `take` gathers in C."""

    type = pa.large_string()

    def __init__(self, file: Any, starts: Any, valid: np.ndarray, size: int) -> None:
        self._file, self._starts_file = file, starts
        self._map = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) if size else None
        self._starts = mmap.mmap(starts.fileno(), 8 * (len(valid) + 1), access=mmap.ACCESS_READ)
        mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        data = pa.py_buffer(self._map if self._map is not None else b"")
        self._column: pa.LargeStringArray | None = pa.LargeStringArray.from_buffers(
            len(valid), pa.py_buffer(self._starts), data, mask, null_count=-1
        )

    def __len__(self) -> int:
        return 0 if self._column is None else len(self._column)

    def text(self, i: int) -> str | None:
        assert self._column is not None, "closed"
        return self._column[i].as_py()

    def take(self, rows: np.ndarray) -> pa.Array:
        """The texts of `rows` (a block of the events table), read from the map."""
        assert self._column is not None, "closed"
        block = self._column.take(pa.array(rows))
        if hasattr(mmap, "MADV_DONTNEED"):  # the pages read stay in the page cache only
            for m in (self._map, self._starts):
                if m is not None:
                    m.madvise(mmap.MADV_DONTNEED)
        return block

    def close(self) -> None:
        self._column = None  # its buffers are the maps: let go of it first
        for m in (self._map, self._starts):
            if m is not None:
                m.close()
        self._map = None
        self._file.close()
        self._starts_file.close()


def spill_directory() -> str | None:
    """Where spill files go: $NEURON_EXPLORER_SPILL_DIR, else the system's temporary folder."""
    return os.environ.get("NEURON_EXPLORER_SPILL_DIR") or None

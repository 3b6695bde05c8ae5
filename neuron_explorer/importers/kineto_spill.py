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
    """Texts (null or not) appended in order, each a row; `take` reads rows back as Arrow."""

    def __init__(self, directory: str | None = None) -> None:
        self._file = tempfile.TemporaryFile(dir=directory)
        self._lengths: list[np.ndarray] = []
        self._valid: list[np.ndarray] = []
        self._size = 0

    def append(self, texts: pa.Array) -> None:
        """Spill one piece's texts (a string array)."""
        offsets: np.ndarray = np.frombuffer(texts.buffers()[1], dtype=_offset_type(texts))
        offsets = offsets[texts.offset : texts.offset + len(texts) + 1]
        data = texts.buffers()[2]
        if data is not None and offsets[-1] > offsets[0]:
            self._file.write(memoryview(data)[int(offsets[0]) : int(offsets[-1])])
        self._lengths.append(np.diff(offsets).astype(np.int64))
        self._valid.append(texts.is_valid().to_numpy(zero_copy_only=False))
        self._size += int(offsets[-1] - offsets[0])

    def finish(self) -> SpilledText:
        """The spilled texts as one column to read rows from."""
        self._file.flush()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        valid = np.concatenate(self._valid) if self._valid else np.zeros(0, bool)
        self._lengths = self._valid = []
        return SpilledText(self._file, lengths, valid, self._size)


def _offset_type(texts: pa.Array) -> type:
    return np.int64 if pa.types.is_large_string(texts.type) else np.int32


class SpilledText:
    """A text column on disk: `take(rows)` as an Arrow string array, `text(i)` one value."""

    type = pa.large_string()

    def __init__(self, file: Any, lengths: np.ndarray, valid: np.ndarray, size: int) -> None:
        self._file = file
        self.starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.starts[1:])
        self.valid = valid
        self._map = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) if size else None
        self._data = np.frombuffer(self._map, np.uint8) if self._map else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.valid)

    def text(self, i: int) -> str | None:
        if not self.valid[i]:
            return None
        return self._data[self.starts[i] : self.starts[i + 1]].tobytes().decode()

    def take(self, rows: np.ndarray) -> pa.Array:
        """The texts of `rows` (a block of the events table), gathered from the map."""
        lo, hi = self.starts[rows], self.starts[rows + 1]
        lengths = hi - lo
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # byte j of the block is byte lo[row] + (j - offsets[row]) of the file
        at = np.repeat(lo - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        data = self._data[at]
        self._drop_pages()
        valid = self.valid[rows]
        mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.LargeStringArray.from_buffers(
            len(rows), pa.py_buffer(offsets), pa.py_buffer(data), mask, null_count=-1
        )

    def _drop_pages(self) -> None:
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self._data = np.zeros(0, np.uint8)
        if self._map is not None:
            self._map.close()
            self._map = None
        self._file.close()


def spill_directory() -> str | None:
    """Where spill files go: $NEURON_EXPLORER_SPILL_DIR, else the system's temporary folder."""
    return os.environ.get("NEURON_EXPLORER_SPILL_DIR") or None

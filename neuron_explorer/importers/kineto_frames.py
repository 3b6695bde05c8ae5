"""The events' source-line and module columns from the python stacks (pystacks): dictionary
columns over the distinct frames, codes a row rather than a text a row (the texts would be the
mapping's largest columns), and which frames the rows name (the sources to keep). Also the
other per-row columns made a block of rows at a time from what the mapping holds: the op and
byte args, held for their events only (`scattered`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..vocab.intervals import NONE

if TYPE_CHECKING:  # pystacks makes its per-row codes with compact, below
    from . import pystacks


def dict_take(dictionary: pa.Array, codes: np.ndarray) -> pa.DictionaryArray:
    """A dictionary column: `codes` (-1: null) into `dictionary`. The codes widened by numpy
    (Arrow's cast of int8 codes took twice the time) and not checked against the dictionary
    (they are its own): a 65,536-row block's column in 130 us, was 210-270."""
    wide = codes.astype(np.int32, copy=False)
    return pa.DictionaryArray.from_arrays(pa.array(wide, mask=wide < 0), dictionary, safe=False)


def dict_rows(dictionary: pa.Array, codes: np.ndarray) -> RowColumn:
    """A dictionary column made a block of rows at a time from `codes` (-1: null)."""
    return RowColumn(lambda rows: dict_take(dictionary, codes[rows]))


@dataclass(frozen=True)
class RowColumn:
    """A column made a block of rows at a time (assemble takes the events in row groups) from
    compact per-row codes: seven columns of a row's frames and module cost three int32 codes
    a row held, not seven columns."""

    make: Callable[[np.ndarray], pa.Array]

    def take(self, rows: np.ndarray) -> pa.Array:
        return self.make(rows)


def row_places(n: int, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Each of `n` rows' place among the rows `first` (0, 1, ...) or among the rows `second`
    (-2, -3, ...; the two disjoint: ops, and runtime calls and device work), -1 for the others:
    one int32 a row, about what the two lists of rows held."""
    places = np.full(n, NONE, dtype=row_index_type(n))
    places[first] = np.arange(first.size, dtype=places.dtype)
    places[second] = -2 - np.arange(second.size, dtype=places.dtype)
    return places


def scattered(
    places: np.ndarray, second: bool, *columns: pa.Array | pa.ChunkedArray
) -> list[RowColumn]:
    """Columns of every row holding each of `columns` at the rows whose place (row_places) is in
    the first set (`second`: the second) and null elsewhere, made a block of rows at a time.
    A block's places are read, not searched for in the rows of each set (a search of 65,536
    rows among 160,000 was 2 ms, a read 0.25)."""
    last: list[Any] = [None, None]  # the last block's rows and their places in the columns

    def positions(rows: np.ndarray) -> pa.Array:
        # the columns of one scattered take the same block of rows in turn: read it once
        if last[0] is not rows:
            p = places[rows]
            if second:
                p = -2 - p
            last[:] = [rows, pa.array(p, mask=p < 0)]
        return last[1]

    def column(values: pa.Array | pa.ChunkedArray) -> RowColumn:
        taken: list[Any] = [None, None]  # the last block's rows and this column's values

        def make(rows: np.ndarray) -> pa.Array:
            if not len(values):
                return pa.nulls(len(rows), values.type)
            if taken[0] is not rows:  # bytes_read and bytes_written take the same column
                taken[:] = [rows, values.take(positions(rows))]
            return taken[1]

        return RowColumn(make)

    return [column(c) for c in columns]


ONE_ARRAY_BYTES = 1 << 30  # a text column this large stays in pieces (int32 offsets)


def one_array(columns: tuple, join: bool) -> tuple:
    """`columns` each as one array where `join` (and it fits), else as they are."""
    if not join:
        return columns
    return tuple(
        c.combine_chunks() if isinstance(c, pa.ChunkedArray) and c.nbytes < ONE_ARRAY_BYTES else c
        for c in columns
    )


def narrow(codes: np.ndarray) -> np.ndarray:
    """Row indices or codes (-1: none) as int32 when they fit (they do below 2**31 rows)."""
    fits = codes.size == 0 or (codes.max() < 2**31 and codes.min() >= -(2**31))
    return codes.astype(np.int32, copy=False) if fits else codes


CODE_TYPES = (np.int8, np.int16, np.int32)


def compact(codes: np.ndarray) -> np.ndarray:
    """Codes into a few distinct values (-1: none) in the narrowest of int8, int16 and int32
    that holds them: a trace's names, lanes, devices, frames and steps number far fewer than
    its rows, and each such column is held a row through the whole mapping."""
    if codes.size == 0:
        return codes
    lo, hi = int(codes.min()), int(codes.max())
    for t in CODE_TYPES:
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            return codes.astype(t, copy=False)
    return codes


def row_indices(mask: np.ndarray) -> np.ndarray:
    """np.flatnonzero(mask) as int32 below 2**31 rows, found a block at a time (flatnonzero
    gives int64: twice the column it leaves, at once)."""
    if len(mask) >= 2**31:
        return np.flatnonzero(mask)
    block = 1 << 22
    parts = [np.flatnonzero(mask[i : i + block]).astype(np.int32) + np.int32(i)
             for i in range(0, len(mask), block)]  # fmt: skip
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def row_index_type(n: int) -> np.dtype:
    """The dtype of a column of row indices into `n` rows: int32 below 2**31 rows (the mapping
    holds several such columns at once, so this halves a term of its peak)."""
    return np.dtype(np.int32 if n < 2**31 else np.int64)


def stack_columns(stacks: pystacks.Stacks) -> dict[str, Any]:
    """The frame columns as dictionaries over the distinct frames (codes, not a text per row:
    the rows' texts would be the mapping's largest columns), each made per block of rows."""
    frames = stacks.frames
    user_frame, model, module = (compact(a) for a in (stacks.user_frame, stacks.model_frame,
                                                      stacks.module))  # fmt: skip
    files = _by_frame([f.file for f in frames])
    lines = pa.array([f.line for f in frames], pa.int32())
    funcs = _by_frame([f.func for f in frames])
    modules = pa.array(stacks.modules, pa.string())

    def line(codes: np.ndarray) -> RowColumn:
        return RowColumn(lambda rows: lines.take(pa.array(codes[rows], mask=codes[rows] < 0)))

    return {
        "stack_id": compact(stacks.stack_id),
        "src_file": RowColumn(lambda rows: files(user_frame[rows])),
        "src_line": line(user_frame),
        "src_func": RowColumn(lambda rows: funcs(user_frame[rows])),
        "model_file": RowColumn(lambda rows: files(model[rows])),
        "model_line": line(model),
        "model_func": RowColumn(lambda rows: funcs(model[rows])),
        "module": RowColumn(lambda rows: dict_take(modules, module[rows])),
    }


def frames_used(n: int, *per_row: np.ndarray) -> np.ndarray:
    """The frames some row names (user and model files: the sources to keep), marked in place
    rather than the rows' frames joined and sorted (two copies of a column per row)."""
    seen = np.zeros(n + 1, dtype=bool)  # the last slot takes -1, no frame
    for frames in per_row:
        seen[frames] = True
    return np.flatnonzero(seen[:n])


def _by_frame(texts: list[str]) -> Callable[[np.ndarray], pa.DictionaryArray]:
    """Rows' frame indices (-1: none) -> a dictionary column of the frames' `texts`."""
    encoded = pa.array(texts, pa.string()).dictionary_encode()
    code = np.append(encoded.indices.to_numpy(zero_copy_only=False), -1)
    return lambda frame: dict_take(encoded.dictionary, code[frame])

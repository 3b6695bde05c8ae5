"""The events' source-line and module columns from the python stacks (pystacks): dictionary
columns over the distinct frames, codes a row rather than a text a row (the texts would be the
mapping's largest columns), and which frames the rows name (the sources to keep)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

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

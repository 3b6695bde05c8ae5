"""JSON text built column-wise with Arrow compute, so an exporter formats a batch of events
without making a Python object per event. Every helper keeps nulls as nulls unless it says not."""

from __future__ import annotations

import json
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class Sink(Protocol):
    """Where JSON bytes go: a file or a gzip stream."""

    def write(self, data: Any, /) -> int: ...


def as_text(arr: pa.Array) -> pa.Array:
    """Plain strings from a dictionary-encoded or string column."""
    return arr.cast(pa.string()) if pa.types.is_dictionary(arr.type) else arr


def quoted(arr: pa.Array) -> pa.Array:
    """JSON string literals; only the distinct values go through json.dumps."""
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    literals = pa.array([json.dumps(v) for v in arr.dictionary.to_pylist()], pa.string())
    return literals.take(arr.indices)


def int_text(arr: pa.Array) -> pa.Array:
    return pc.cast(arr, pa.string())


def us_text(ns: pa.Array) -> pa.Array:
    """Integer nanoseconds as exact decimal microseconds ("1234.567"), with no float rounding."""
    ns = pc.cast(ns, pa.int64())
    mag = pc.abs(ns)
    whole = pc.divide(mag, 1000)  # integer division of non-negatives
    frac = pc.subtract(mag, pc.multiply(whole, 1000))
    whole_s = pc.cast(whole, pa.string())
    frac_s = pc.utf8_lpad(pc.cast(frac, pa.string()), width=3, padding="0")
    text = pc.if_else(pc.equal(frac, 0), whole_s, join(whole_s, ".", frac_s))
    return pc.if_else(pc.less(ns, 0), join("-", text), text)


def finite_text(values: pa.Array) -> pa.Array:
    """Floats as JSON numbers; callers drop non-finite rows first (JSON has no NaN)."""
    return pc.cast(values, pa.string())


def raw_json(arr: pa.Array) -> pa.Array:
    """A column of JSON text, checked: values that do not parse become JSON strings."""
    import msgspec

    arr = as_text(arr)
    present = pc.drop_null(arr)
    if len(present) == 0:
        return arr
    joined = pc.binary_join(pa.ListArray.from_arrays([0, len(present)], present), ",")
    try:
        msgspec.json.decode(
            b"[" + joined[0].as_buffer().to_pybytes() + b"]", type=list[msgspec.Raw]
        )
        return arr
    except msgspec.DecodeError:
        pass
    fixed = []
    for v in arr.to_pylist():  # rare: only a batch holding bad JSON pays per row
        if v is not None:
            try:
                msgspec.json.decode(v)
            except msgspec.DecodeError:
                v = json.dumps(v)
        fixed.append(v)
    return pa.array(fixed, pa.string())


def field(key: str, text: pa.Array) -> pa.Array:
    """`,"key":text` where text is not null, else the empty string."""
    return pc.fill_null(join(f',"{key}":', text), "")


def join(*parts: pa.Array | str) -> pa.Array:
    """Element-wise concatenation; null if any part is null."""
    return pc.binary_join_element_wise(*parts, "")


def choose(cond: pa.Array, if_true: str, if_false: str) -> pa.Array:
    return pc.if_else(cond, if_true, if_false)


class LineWriter:
    """Writes string arrays whose values each start with ",\\n", dropping the comma before the
    very first value so the enclosing JSON array stays valid."""

    def __init__(self, fh: Sink) -> None:
        self.fh = fh
        self.first = True
        self.written = 0

    def write(self, lines: pa.Array) -> None:
        if isinstance(lines, pa.ChunkedArray):
            lines = lines.combine_chunks()
        if len(lines) == 0:
            return
        if lines.null_count:
            raise ValueError("a JSON line was null")  # a bug in a formatter, never bad input
        large = pa.types.is_large_string(lines.type)
        width, dtype = (8, np.int64) if large else (4, np.int32)
        offsets = np.frombuffer(
            lines.buffers()[1], dtype=dtype, count=len(lines) + 1, offset=lines.offset * width
        )
        data = memoryview(lines.buffers()[2])[int(offsets[0]) : int(offsets[-1])]
        if self.first:
            data = data[1:]
            self.first = False
        self.fh.write(data)
        self.written += len(lines)

    def write_text(self, lines: list[str]) -> None:
        """Small Python-built lines (metadata), same leading-comma rule."""
        if lines:
            self.write(pa.array(lines, pa.string()))

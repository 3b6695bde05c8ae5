"""Reading and decoding a Kineto trace into columns without building a dict per event.

msgspec decodes each event into a small typed struct; `args` stays raw JSON text (msgspec.Raw,
a view into the buffer) and becomes one Arrow string column in bulk. Times decode as float64,
which is exact to the nanosecond below 2**43 us (the relative times of current torch.profiler
traces); an event with a larger time (microseconds since 1970 with nanosecond digits) takes it
from the text instead. The decoding itself goes range by range: see kineto_ranges.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import BadInputError

EMPTY = msgspec.Raw(b"")
GZIP_MAGIC = b"\x1f\x8b"
READ_CHUNK = 1 << 20
EXACT_FLOAT_US = 2.0**43  # below this a float64 of microseconds keeps every nanosecond digit


class Event(msgspec.Struct, gc=False):
    """One traceEvents entry, as decoded (unknown keys are skipped by msgspec)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float | None = None
    dur: float | None = None
    id: int | str | None = None
    args: msgspec.Raw = EMPTY


class TimesEvent(msgspec.Struct, gc=False):
    """The times of an event as text, for events whose float time lost digits."""

    ts: msgspec.Raw = EMPTY
    dur: msgspec.Raw = EMPTY


class Trace(msgspec.Struct, gc=False):
    """The top level of a Kineto trace: the events and the few keys the importer reads."""

    traceEvents: list[Event]
    deviceProperties: list[dict[str, Any]] = []
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    schemaVersion: Any = None
    traceName: Any = None
    displayTimeUnit: Any = None
    host_name: Any = None


TOP_KEYS = tuple(f for f in Trace.__struct_fields__ if f != "traceEvents")


def read_bytes(path: Path) -> bytearray:
    """The file's JSON text, gunzipped in a stream when it is gzip (one buffer, no copies)."""
    try:
        with path.open("rb") as f:
            gz = f.read(2) == GZIP_MAGIC
            f.seek(0)
            return _gunzip(f, path) if gz else _read_all(f)
    except OSError as e:
        raise BadInputError(path, f"cannot read ({e.strerror or e})") from None


def _read_all(f: Any) -> bytearray:
    """The whole file in one buffer of its size (f.read() grows a buffer: twice the memory)."""
    buf = bytearray(os.fstat(f.fileno()).st_size)
    view, got = memoryview(buf), 0
    while got < len(buf) and (n := f.readinto(view[got:])):
        got += n
    del view
    if got < len(buf):  # the file shrank while read
        del buf[got:]
    return buf


def _gunzip(f: Any, path: Path) -> bytearray:
    out = bytearray()
    d = zlib.decompressobj(wbits=31)
    try:
        while chunk := f.read(READ_CHUNK):
            while chunk:
                if d.eof:  # a multi-member gzip: go on with the next member
                    d = zlib.decompressobj(wbits=31)
                out += d.decompress(chunk)
                chunk = d.unused_data
    except zlib.error as e:
        raise BadInputError(path, f"corrupt gzip data ({e})") from None
    if not d.eof:
        raise BadInputError(path, "truncated gzip file (unexpected end of data)")
    return out


HEAD_BYTES = 4096  # a trace's first bytes, enough to tell its form
ARRAY_KEY = b'{"traceEvents":'
_SPACE = re.compile(rb"\s*")


def as_trace_object(buf: bytearray) -> bytearray:
    """A trace written as a top-level JSON array of events (the Chrome trace format's other
    form, which old torch.profiler and the TensorBoard plugin's samples use) rewritten in place
    as {"traceEvents": [...]}; the format lets the closing ] be left out. Other text is
    returned as it is."""
    start = _SPACE.match(buf).end()  # type: ignore[union-attr]
    if buf[start : start + 1] != b"[":
        return buf
    tail = bytes(buf[-64:]).rstrip()
    del buf[len(buf) - (len(buf[-64:]) - len(tail)) :]  # trailing whitespace
    if not tail.endswith(b"]"):
        if tail.endswith(b","):
            del buf[-1:]
        buf += b"]"
    buf[start:start] = ARRAY_KEY
    buf += b"}"
    return buf


def decode(path: Path, buf: bytes | bytearray | memoryview) -> Trace:
    """Decode a trace; raises BadInputError naming the file for invalid JSON or a non-trace."""
    if not bytes(buf[:4096]).strip() and not bytes(buf).strip():
        raise BadInputError(path, "empty file")
    try:
        return msgspec.json.decode(buf, type=Trace)
    except msgspec.ValidationError as e:
        raise BadInputError(path, f"not a torch.profiler trace ({e})") from None
    except msgspec.DecodeError as e:
        raise BadInputError(path, f"invalid JSON ({e})") from None
    except RecursionError:  # msgspec's decoder recurses per nesting level
        raise BadInputError(path, "JSON nested too deeply to read") from None


def raw_column(raws: list[msgspec.Raw]) -> pa.Array:
    """Raw JSON texts as one Arrow string array, built from offsets (empty text becomes null)."""
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    return raw_column_from(lengths, b"".join(raws))


def raw_column_from(lengths: np.ndarray, data: bytes | bytearray) -> pa.Array:
    """Texts of int64 `lengths` laid end to end in `data` as one Arrow string array (a text
    of length 0 becomes null)."""
    n = len(lengths)
    large = len(data) >= 2**31
    offsets = np.zeros(n + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    validity = lengths > 0
    mask_buf = None if validity.all() else pa.py_buffer(np.packbits(validity, bitorder="little"))
    cls = pa.LargeStringArray if large else pa.StringArray
    return cls.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data), mask_buf, null_count=-1)


def prefixed(prefix: str, col: pa.Array) -> pa.Array:
    """`prefix` + each value (null stays null)."""
    return pc.binary_join_element_wise(pa.scalar(prefix, col.type), col, pa.scalar("", col.type))


class Factorizer(dict):
    """Codes of JSON scalars in first-seen order, over several batches; None gets code -1.

    A dict from value to code: looking a batch up runs in C (map over dict.__getitem__), and
    Python code runs only for a value not seen before (__missing__).
    """

    def __init__(self) -> None:
        super().__init__({None: -1})
        self.seen: list[Any] = []  # the distinct values, by code

    def __missing__(self, value: Any) -> int:
        code = self[value] = len(self.seen)
        self.seen.append(value)
        return code

    def codes(self, batch: list[Any]) -> np.ndarray:
        # the values not seen before added first, in first-seen order (dict.fromkeys keeps
        # it), by one update: a batch of mostly new values (flow ids) calls no __missing__
        new = [v for v in dict.fromkeys(batch) if v not in self]
        if new:
            self.update(zip(new, range(len(self.seen), len(self.seen) + len(new)), strict=True))
            self.seen.extend(new)
        return np.fromiter(map(self.__getitem__, batch), dtype=np.int64, count=len(batch))

    def remap(self, values: list[Any]) -> np.ndarray:
        """Another factorizer's distinct `values` in this one's numbering, plus a last -1 so
        that `remap[codes]` maps its codes (-1 included); int32 (half the memory of the
        merged codes) unless there are more values than that holds."""
        remap = np.append(self.codes(values), -1)
        return remap.astype(np.int32) if len(values) < 2**31 else remap


def as_text(values: list[Any]) -> pa.Array:
    """Distinct values as Arrow strings (the decoded objects are not kept: a few objects alive
    from the middle of the decode would pin its memory arenas and keep them from the OS)."""
    if set(map(type, values)) == {int}:  # flow ids, pids, tids: Arrow writes them as str does
        try:  # (a tenth of the time of str per value: 120,000 ids a chunk of the 1 GB trace)
            return pa.array(values, pa.int64()).cast(pa.string())
        except (OverflowError, pa.ArrowException):  # beyond int64
            pass
    return pa.array([str(v) for v in values], pa.string())


@dataclass(frozen=True)
class Times:
    ns: np.ndarray  # int64 nanoseconds (0 where missing or out of range)
    missing: np.ndarray  # bool
    out_of_range: np.ndarray  # bool: |time| >= MAX_TIME_US (or not finite), ns unusable

    @staticmethod
    def concat(parts: list[Times]) -> Times:
        return Times(
            np.concatenate([t.ns for t in parts]),
            np.concatenate([t.missing for t in parts]),
            np.concatenate([t.out_of_range for t in parts]),
        )


# 2**62 ns (the year 2116 as unix time): a time, plus the trace's base time and a duration,
# still fits int64 nanoseconds
MAX_TIME_US = 2.0**62 / 1000


def float_times(values: list[float | None]) -> tuple[Times, np.ndarray]:
    """Microseconds decoded as float64 -> integer ns, and which events need their text instead
    (|us| >= EXACT_FLOAT_US, where float64 may have lost nanosecond digits)."""
    arr = pa.array(values, pa.float64())
    us = pc.fill_null(arr, 0.0).to_numpy(zero_copy_only=False)
    return us_times(us, arr.is_null().to_numpy(zero_copy_only=False))


def us_times(us: np.ndarray, missing: np.ndarray) -> tuple[Times, np.ndarray]:
    """float_times of microseconds already in float64 (`us` 0 where `missing`)."""
    out = ~(np.abs(us) < MAX_TIME_US)  # NaN and inf included
    if out.any():
        us = np.where(out, 0.0, us)
    whole = np.floor(us)
    ns = whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)
    return Times(ns, missing, out), np.abs(us) >= EXACT_FLOAT_US


def text_ns(raws: list[msgspec.Raw], fallback: np.ndarray) -> np.ndarray:
    """Microseconds as written in the JSON -> exact integer ns (decimal parse in Arrow; each
    value on its own when some have more than 3 decimals or an exponent). A value beyond int64
    nanoseconds keeps its `fallback` (the float path's)."""
    col = raw_column(raws)
    try:
        dec = pc.cast(col, pa.decimal128(38, 3))
        ns = np.frombuffer(dec.buffers()[1], dtype=np.int64)[::2]
        ok = pc.less(pc.abs(dec), pa.scalar(MAX_TEXT_US, pa.decimal128(38, 3)))
        if pc.all(ok).as_py():
            return ns[dec.offset : dec.offset + len(dec)].copy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    return np.array(
        [_text_ns(bytes(r), f) for r, f in zip(raws, fallback.tolist(), strict=True)],
        dtype=np.int64,
    )


MAX_TEXT_US = 2**53  # 9.0e18 ns: within int64


def _text_ns(text: bytes, fallback: int) -> int:
    """One time's text -> ns, rounded half to even."""
    try:
        us = Decimal(text.decode())
    except (InvalidOperation, UnicodeDecodeError):
        return fallback
    if not abs(us) < MAX_TEXT_US:
        return fallback
    return int((us * 1000).to_integral_value(ROUND_HALF_EVEN))


def ints(values: list[Any]) -> pa.Int64Array:
    """A list of JSON scalars as int64 (numbers in strings parsed; anything else null)."""
    try:
        return pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array([_as_int(v) for v in values], type=pa.int64())


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    try:
        return int(float(v))
    except (TypeError, ValueError, OverflowError):
        return None

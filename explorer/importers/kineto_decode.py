"""Reading and decoding a Kineto trace file into columns without building a dict per event.

msgspec decodes each event into a small typed struct; `ts`, `dur`, `pid`, `tid` and `args` stay
as raw JSON text (msgspec.Raw, a view into the file's buffer), turned into Arrow columns in bulk.
Time values are parsed from their text, so nanosecond digits survive (a float64 cannot hold
microseconds since 1970 to the nanosecond).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
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


class Event(msgspec.Struct, gc=False):
    """One traceEvents entry, as decoded (unknown keys are skipped by msgspec)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: msgspec.Raw = EMPTY
    tid: msgspec.Raw = EMPTY
    ts: msgspec.Raw = EMPTY
    dur: msgspec.Raw = EMPTY
    id: msgspec.Raw = EMPTY
    args: msgspec.Raw = EMPTY


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


def read_bytes(path: Path) -> bytes | bytearray:
    """The file's JSON text, gunzipped in a stream when it is gzip (one buffer, no copies)."""
    try:
        with path.open("rb") as f:
            head = f.read(2)
            if head != GZIP_MAGIC:
                return head + f.read()
            f.seek(0)
            return _gunzip(f, path)
    except OSError as e:
        raise BadInputError(path, f"cannot read ({e.strerror or e})") from None


def _gunzip(f: Any, path: Path) -> bytearray:
    out = bytearray()
    d = zlib.decompressobj(wbits=31)
    try:
        while chunk := f.read(READ_CHUNK):
            while chunk:
                out += d.decompress(chunk)
                chunk = d.unused_data
                if d.eof:  # a multi-member gzip: go on with the next member
                    d = zlib.decompressobj(wbits=31)
                    if not chunk:
                        return out
        out += d.flush()
    except zlib.error as e:
        raise BadInputError(path, f"corrupt gzip data ({e})") from None
    if not d.eof:
        raise BadInputError(path, "truncated gzip file (unexpected end of data)")
    return out


def decode(path: Path, buf: bytes | bytearray) -> Trace:
    """Decode a trace; raises BadInputError naming the file for invalid JSON or a non-trace."""
    if not buf.strip():
        raise BadInputError(path, "empty file")
    try:
        return msgspec.json.decode(buf, type=Trace)
    except msgspec.ValidationError as e:
        raise BadInputError(path, f"not a torch.profiler trace ({e})") from None
    except msgspec.DecodeError as e:
        raise BadInputError(path, f"invalid JSON ({e})") from None


def raw_column(raws: list[msgspec.Raw]) -> pa.LargeStringArray:
    """Raw JSON texts as one Arrow string array, built from offsets (empty text becomes null)."""
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = b"".join(raws)
    validity = lengths > 0
    mask_buf = None if validity.all() else pa.py_buffer(np.packbits(validity, bitorder="little"))
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(data), mask_buf, null_count=-1
    )


def prefixed(prefix: str, col: pa.Array) -> pa.Array:
    """`prefix` + each value (null stays null)."""
    return pc.binary_join_element_wise(pa.scalar(prefix, col.type), col, pa.scalar("", col.type))


def unquote(col: pa.Array) -> pa.Array:
    """Raw JSON scalars as text: strings lose their quotes, numbers stay as written."""
    return pc.replace_substring_regex(col, pattern=r'^"(.*)"$', replacement=r"\1")


_NUMBER = r"^-?[0-9]+(\.[0-9]+)?$"


@dataclass(frozen=True)
class ParsedTimes:
    ns: np.ndarray  # int64 nanoseconds
    bad: np.ndarray  # bool: missing or not a number


def micros_to_ns(col: pa.Array) -> ParsedTimes:
    """Parse microsecond values written as JSON numbers into exact integer nanoseconds."""
    n = len(col)
    present = pc.fill_null(pc.is_valid(col), False)
    plain = pc.fill_null(pc.match_substring_regex(col, _NUMBER), False)
    text = pc.if_else(plain, col, pa.scalar("0", col.type))
    neg = pc.fill_null(pc.starts_with(text, "-"), False)
    text = pc.utf8_ltrim(text, characters="-")
    parts = pc.split_pattern(text, ".", max_splits=1)
    whole = pc.list_element(parts, 0)
    frac = pc.fill_null(_second(parts), "")
    frac = pc.utf8_rpad(pc.utf8_slice_codeunits(frac, 0, 3), 3, "0")
    ns = pc.add(pc.multiply(pc.cast(whole, pa.int64()), 1000), pc.cast(frac, pa.int64())).to_numpy(
        zero_copy_only=False
    )
    ns = np.where(neg.to_numpy(zero_copy_only=False), -ns, ns)
    # Numbers in exponent notation (rare: not written by Kineto) go through float64.
    odd = present.to_numpy(zero_copy_only=False) & ~plain.to_numpy(zero_copy_only=False)
    bad = ~present.to_numpy(zero_copy_only=False)
    if odd.any():
        for i in np.flatnonzero(odd):
            try:
                ns[i] = round(float(col[i].as_py()) * 1000)
            except ValueError:
                bad[i] = True
    return ParsedTimes(ns.astype(np.int64, copy=False) if n else np.zeros(0, np.int64), bad)


def _second(parts: pa.Array) -> pa.Array:
    sizes = pc.list_value_length(parts)
    has = pc.fill_null(pc.greater(sizes, 1), False)
    padded = pc.if_else(has, parts, pa.scalar(["", ""], parts.type))
    return pc.list_element(padded, 1)


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

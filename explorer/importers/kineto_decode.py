"""Reading and decoding a Kineto trace file into columns without building a dict per event.

msgspec decodes each event into a small typed struct; `args` stays raw JSON text (msgspec.Raw,
a view into the file's buffer) and becomes one Arrow string column in bulk. Times decode as
float64, which is exact to the nanosecond below 2**43 us (the relative times of current
torch.profiler traces); for larger fractional times (microseconds since 1970 with nanosecond
digits) a second pass parses the times from their text.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
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


class ArgsEvent(msgspec.Struct, gc=False):
    """The args of an event as raw JSON text (a second, lighter pass: see `extract`)."""

    args: msgspec.Raw = EMPTY


class ArgsTrace(msgspec.Struct, gc=False):
    traceEvents: list[ArgsEvent]


class TimesEvent(msgspec.Struct, gc=False):
    """The times of an event as text, for the exact second pass."""

    ts: msgspec.Raw = EMPTY
    dur: msgspec.Raw = EMPTY


class TimesTrace(msgspec.Struct, gc=False):
    traceEvents: list[TimesEvent]


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


def decode(path: Path, buf: bytes | bytearray) -> Trace:
    """Decode a trace; raises BadInputError naming the file for invalid JSON or a non-trace."""
    if not buf[:4096].strip() and not buf.strip():
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
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    data = b"".join(raws)
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


def factorize(values: list[Any]) -> tuple[np.ndarray, pa.Array]:
    """Codes and distinct values (as text) of JSON scalars; None gets code -1.

    The distinct values come back as Arrow strings, not the decoded objects: a few objects kept
    alive from the middle of the decode would pin its memory arenas and keep them from the OS.
    """
    index = dict.fromkeys(values)  # both passes run in C: no Python code per value
    uniques = [v for v in index if v is not None]
    index.update((v, i) for i, v in enumerate(uniques))
    index[None] = -1
    codes = np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))
    return codes, pa.array([str(v) for v in uniques], pa.string())


NULL = msgspec.Raw(b"null")


def args_pass(
    d: Decoded,
    rows: np.ndarray,
    subsets: dict[str, tuple[type, np.ndarray, Callable[[list[Any]], Any]]],
) -> tuple[pa.Array, dict[str, Any]]:
    """Second pass over the file, for the args: the JSON text of `rows`, and for each subset
    `(struct, events, to_columns)` the columns `to_columns` makes of the events' args decoded
    into `struct` (None where an event has none), one subset at a time. Frees the file buffer.

    It runs once the first pass's structs are gone: holding the file, every event struct and
    the args column at once would cost a third more memory.
    """
    assert d.buf is not None, "args_pass runs once per Decoded"
    raws = [e.args for e in msgspec.json.decode(d.buf, type=ArgsTrace).traceEvents]
    d.buf = None
    typed = {}
    for key, (struct, idx, to_columns) in subsets.items():
        subset = [raws[i] or NULL for i in idx]
        decoder = msgspec.json.Decoder(struct | None)
        try:
            decoded = decoder.decode_lines(b"\n".join(subset)) if idx.size else []
        except msgspec.ValidationError:  # an odd args object: keep the rest, this one as None
            decoded = [_decode_or_none(decoder, r) for r in subset]
        typed[key] = to_columns(decoded)
        del decoded
    # last: the subsets' temporary buffers are gone by now, so the peaks do not add up
    return raw_column([raws[i] for i in rows]), typed


def _decode_or_none(decoder: msgspec.json.Decoder, raw: msgspec.Raw) -> Any:
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError:
        return None


@dataclass
class Decoded:
    """A trace's events as columns (codes into distinct values) plus the top-level keys."""

    n: int
    ph: np.ndarray  # fixed-width str array (no Python objects kept)
    name_code: np.ndarray
    names: pa.Array  # distinct names (strings)
    cat_code: np.ndarray
    cats: list[str]
    pid_code: np.ndarray
    pids: pa.Array  # distinct pids as text
    tid_code: np.ndarray
    tids: pa.Array
    id_code: np.ndarray
    ids: pa.Array
    ts: Times
    dur: Times
    buf: bytes | bytearray | None  # the file, kept for the args pass (args_pass frees it)
    trace: Trace  # top-level keys, with traceEvents emptied


def extract(path: Path, report: Callable[[float], None] = lambda f: None) -> Decoded:
    """Read and decode a trace into columns, all but the args (see `args_pass`); the per-event
    structs are freed on return."""
    buf = read_bytes(path)
    report(0.15)
    trace = decode(path, buf)
    report(0.4)
    evs = trace.traceEvents
    n = len(evs)
    ts_us = pa.array([e.ts for e in evs], pa.float64())
    dur_us = pa.array([e.dur for e in evs], pa.float64())
    if needs_exact(ts_us) or needs_exact(dur_us):
        times = msgspec.json.decode(buf, type=TimesTrace).traceEvents
        ts, dur = text_times([e.ts for e in times]), text_times([e.dur for e in times])
        del times
    else:
        ts, dur = float_times(ts_us), float_times(dur_us)
    names = pa.array([e.name for e in evs], pa.string()).dictionary_encode()
    cats = pa.array([e.cat for e in evs], pa.string()).dictionary_encode()
    pid_code, pids = factorize([e.pid for e in evs])
    tid_code, tids = factorize([e.tid for e in evs])
    id_code, ids = factorize([e.id for e in evs])
    ph = np.array([e.ph for e in evs], dtype="U4").reshape(-1)
    trace.traceEvents = []
    del evs
    out = Decoded(
        n=n,
        ph=ph,
        name_code=_codes(names),
        names=names.dictionary,
        cat_code=_codes(cats),
        cats=cats.dictionary.to_pylist(),
        pid_code=pid_code,
        pids=pids,
        tid_code=tid_code,
        tids=tids,
        id_code=id_code,
        ids=ids,
        ts=ts,
        dur=dur,
        buf=buf,
        trace=trace,
    )
    return out


def _codes(d: pa.DictionaryArray) -> np.ndarray:
    return d.indices.to_numpy(zero_copy_only=False).astype(np.int64)


@dataclass(frozen=True)
class Times:
    ns: np.ndarray  # int64 nanoseconds (0 where missing)
    missing: np.ndarray  # bool


def float_times(arr: pa.Array) -> Times:
    """Microseconds decoded as float64 -> integer ns, exact while |us| < EXACT_FLOAT_US."""
    us = pc.fill_null(arr, 0.0).to_numpy(zero_copy_only=False)
    whole = np.floor(us)
    ns = whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)
    return Times(ns, arr.is_null().to_numpy(zero_copy_only=False))


def needs_exact(values: pa.Array) -> bool:
    """True when some time is large enough that float64 lost its nanosecond digits."""
    arr = pc.fill_null(values, 0.0).to_numpy(zero_copy_only=False)
    big = np.abs(arr) >= EXACT_FLOAT_US
    return bool(big.any() and (arr[big] != np.floor(arr[big])).any())


def text_times(raws: list[msgspec.Raw]) -> Times:
    """Microseconds as written in the JSON -> exact integer ns (decimal parse in Arrow)."""
    col = raw_column(raws)
    missing = col.is_null().to_numpy(zero_copy_only=False)
    filled = pc.fill_null(col, "0")
    try:
        dec = pc.cast(filled, pa.decimal128(38, 3))
        ns = np.frombuffer(dec.buffers()[1], dtype=np.int64)[::2][
            dec.offset : dec.offset + len(dec)
        ]
        return Times(ns.copy(), missing)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # more than 3 decimals or exponent notation: float64 on the text's fraction
        return float_times(pa.array([float(x) for x in filled.to_pylist()], pa.float64()))


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

"""The native range scanner (kineto_scan.cpp): a range of traceEvents turned straight into its
columns, without a Python object per event. Built with g++ at first use into a cache folder
(under a lock, renamed into place) and loaded by ctypes; without a compiler, when the build
fails, or with NEURON_EXPLORER_NATIVE=0, `scan` answers None and the ranges are decoded by
msgspec as before. The scanner refuses any range it does not read exactly as msgspec would
(None again), so both ways give the same columns.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from . import kineto_decode as kd

SOURCE = Path(__file__).with_name("kineto_scan.cpp")
ENV = "NEURON_EXPLORER_NATIVE"  # "0": never build or use the scanner
FIELDS = ("ph", "name", "cat", "pid", "tid", "id")  # kineto_ranges.FIELDS, in the scanner's order
DEFAULTS = (b'""', b'""', b'""', b"0", b"0", b"null")  # an absent field's value (kd.Event)
TYPES: dict[str, Any] = {
    "ph": list[str],
    "name": list[str],
    "cat": list[str],
    "pid": list[int | str],
    "tid": list[int | str],
    "id": list[int | str | None],
}
BYTES_PER_EVENT = 24  # room for a range's events: its bytes over this (more on a retry)

_lib: Any = None  # the loaded library, False once it cannot be


def available() -> bool:
    """Whether the scanner is built and loaded (building it now if need be)."""
    global _lib
    if _lib is None:
        _lib = _load() if os.environ.get(ENV, "1") != "0" else False
    return bool(_lib)


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "neuron-explorer"


def library_path() -> Path:
    tag = f"{sys.platform}|{os.uname().machine}".encode()
    digest = hashlib.sha256(SOURCE.read_bytes() + tag).hexdigest()[:16]
    return cache_dir() / f"kineto_scan_{digest}.so"


def build(path: Path) -> None:
    """Compile kineto_scan.cpp into `path`: in a temp file renamed into place, under a lock so
    that processes starting together build it once."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) found")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / "kineto_scan.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        # no -ffast-math, no fused multiply-add: float times must round as numpy rounds them
        cmd = [compiler, "-O3", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off"]
        try:
            subprocess.run(
                [*cmd, str(SOURCE), "-o", tmp], check=True, capture_output=True, timeout=300
            )
            os.replace(tmp, path)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"building {SOURCE.name} failed: {e.stderr.decode()[-300:]}") from e
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _load() -> Any:
    try:
        path = library_path()
        if not path.exists():
            build(path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return False
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ne_scan.argtypes = [p, i64, ctypes.c_char_p, i64, i64, p, p]
    lib.ne_scan.restype = i64
    lib.ne_gather.argtypes = [p, p, p, p, i64, ctypes.c_char_p, i64, ctypes.c_char_p, i64, p]
    lib.ne_gather.restype = i64
    lib.ne_first_use.argtypes = [p, i64, i64, p, p]
    lib.ne_first_use.restype = i64
    lib.ne_token_array.argtypes = [p, p, p, i64, ctypes.c_char_p, i64, p]
    lib.ne_token_array.restype = i64
    lib.ne_args_fields.argtypes = [p, p, p, p, i64, p, p, p, i64, p, p, p]
    lib.ne_args_fields.restype = i64
    return lib


def first_use(codes: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray] | None:
    """`codes` (-1: none, else below `m`) renumbered by first use as int32, and the codes used
    in that order; None without the library (the caller does it with numpy)."""
    if not available():
        return None
    codes = np.ascontiguousarray(codes, np.int64)
    out = np.empty(codes.size, np.int32)
    used = np.empty(min(codes.size, m), np.int64)
    k = _lib.ne_first_use(codes.ctypes.data, codes.size, m, out.ctypes.data, used.ctypes.data)
    return out, used[:k]


class _Scratch:
    """The scanner's output arrays, kept from range to range (fresh arrays per range would be
    fresh pages: page faults and system time)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.codes = [np.empty(cap, np.int32) for _ in FIELDS]
        self.tok_off = [np.empty(cap + 1, np.int64) for _ in FIELDS]
        self.tok_len = [np.empty(cap + 1, np.int32) for _ in FIELDS]
        self.us = [np.empty(cap, np.float64) for _ in range(2)]
        self.missing = [np.empty(cap, np.bool_) for _ in range(2)]
        self.time_off = [np.empty(cap, np.int64) for _ in range(2)]
        self.time_len = [np.empty(cap, np.int32) for _ in range(2)]
        self.args_off = np.empty(cap, np.int64)
        self.args_len = np.empty(cap, np.int32)
        arrays: list[np.ndarray] = [
            *self.codes, *self.tok_off, *self.tok_len, *self.us, *self.missing,
            *self.time_off, *self.time_len, self.args_off, self.args_len,
        ]  # fmt: skip
        self.pointers = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
        self.n_tokens = np.zeros(len(FIELDS), np.int64)


_local = threading.local()  # each thread's _Scratch (a web server may import in threads)


@dataclass
class Scanned:
    """A range's events as the scanner read them (views of the scratch arrays: used before the
    next range is scanned)."""

    n: int
    buf: np.ndarray  # the range's bytes (uint8), which the spans below point into
    local: list[np.ndarray]  # per field: codes into its distinct tokens
    tokens: list[bytearray]  # per field: its distinct token texts as a JSON array, first seen first
    us: list[np.ndarray]  # ts, dur as float64 (0 where missing)
    missing: list[np.ndarray]
    time_off: list[np.ndarray]
    time_len: list[np.ndarray]
    args_off: np.ndarray
    args_len: np.ndarray

    def values(self, field: int) -> list[Any]:
        """A field's distinct values, decoded by msgspec from their texts (as the event
        decode reads them)."""
        return msgspec.json.decode(self.tokens[field], type=TYPES[FIELDS[field]])

    def time_texts(self, which: int, idx: np.ndarray) -> list[bytes]:
        off, length = self.time_off[which], self.time_len[which]
        return [self.buf[o : o + n].tobytes() for o, n in zip(off[idx], length[idx], strict=True)]

    def args_lines(self, idx: np.ndarray) -> bytearray:
        """The args texts of events `idx` as JSON lines ("null" for none)."""
        return self._gather(idx, b"\n", b"null")

    def args_list(self, idx: np.ndarray) -> list[bytes]:
        off, length = self.args_off, self.args_len
        return [
            self.buf[o : o + n].tobytes() or b"null"
            for o, n in zip(off[idx], length[idx], strict=True)
        ]

    def args_column(self, idx: np.ndarray) -> pa.Array:
        """The args texts of events `idx` as a string column (null where there are none), as
        kineto_decode.raw_column makes it."""
        lengths = self.args_len[idx].astype(np.int64)
        return kd.raw_column_from(lengths, self._gather(idx, b"", b""))

    def args_fields(
        self, idx: np.ndarray, fields: tuple[tuple[bytes, bool], ...]
    ) -> list[pa.Array] | None:
        """The args fields `fields` ((key, whether an integer) pairs) of events `idx` as the
        columns kineto_args makes (kd.ints of an integer, kd.raw_column of the value's text);
        None where some event's args are not of the plain form the scanner reads."""
        idx = np.ascontiguousarray(idx, np.int64)
        n, k = len(idx), len(fields)
        state, vlen = np.zeros((k, n), np.uint8), np.zeros((k, n), np.int32)
        val = [np.zeros(n, np.int64) for _ in fields]  # an array each: a column's buffer
        val_at = (ctypes.c_void_p * k)(*(v.ctypes.data for v in val))
        keys = (ctypes.c_char_p * k)(*(key for key, _ in fields))
        key_len = np.array([len(key) for key, _ in fields], np.int32)
        kind = np.array([0 if is_int else 1 for _, is_int in fields], np.int32)
        if n and _lib.ne_args_fields(
            self.buf.ctypes.data, self.args_off.ctypes.data, self.args_len.ctypes.data,
            idx.ctypes.data, n, keys, key_len.ctypes.data, kind.ctypes.data, k,
            state.ctypes.data, val_at, vlen.ctypes.data,
        ) < 0:  # fmt: skip
            return None
        return [
            _int_column(val[j], state[j].view(np.bool_))
            if is_int
            else kd.raw_column_from(vlen[j].astype(np.int64), _spans(self.buf, val[j], vlen[j]))
            for j, (_, is_int) in enumerate(fields)
        ]

    def _gather(self, idx: np.ndarray, sep: bytes, empty: bytes) -> bytearray:
        idx = np.ascontiguousarray(idx, np.int64)
        lengths = self.args_len[idx]
        size = int(lengths.sum()) + len(empty) * int((lengths == 0).sum())
        size += len(sep) * max(0, len(idx) - 1)
        out = bytearray(size)
        if len(idx):
            wrote = _lib.ne_gather(
                self.buf.ctypes.data, self.args_off.ctypes.data, self.args_len.ctypes.data,
                idx.ctypes.data, len(idx), sep, len(sep), empty, len(empty),
                (ctypes.c_char * size).from_buffer(out) if size else None,
            )  # fmt: skip
            assert wrote == size
        return out


def _int_column(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """int64 `values`, null where not `valid` (kd.ints of the same ints and Nones)."""
    mask = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.int64(), len(values), [mask, pa.py_buffer(values)])


def _spans(buf: np.ndarray, off: np.ndarray, length: np.ndarray) -> bytearray:
    """The texts buf[off[i]:off[i]+length[i]] laid end to end (length 0: nothing)."""
    size = int(length.sum(dtype=np.int64))
    out = bytearray(size)
    if size:
        every = np.arange(len(off), dtype=np.int64)
        wrote = _lib.ne_gather(
            buf.ctypes.data, off.ctypes.data, length.ctypes.data, every.ctypes.data, len(off),
            b"", 0, b"", 0, (ctypes.c_char * size).from_buffer(out),
        )  # fmt: skip
        assert wrote == size
    return out


def _token_array(buf: np.ndarray, s: _Scratch, field: int, absent: bytes) -> bytearray:
    """A field's distinct tokens as one JSON array text."""
    k = int(s.n_tokens[field])
    off, length = s.tok_off[field][:k], s.tok_len[field][:k]
    size = 2 + max(0, k - 1) + int(length.sum()) + len(absent)
    out = bytearray(size)
    wrote = _lib.ne_token_array(
        buf.ctypes.data, off.ctypes.data, length.ctypes.data, k, absent, len(absent),
        (ctypes.c_char * size).from_buffer(out),
    )  # fmt: skip
    del out[wrote:]
    return out


def scan(view: memoryview, key: bytes) -> Scanned | None:
    """The events of a range wrapped as {"<key>":[...]} (None: the scanner is not there, or
    refused the range; decode it with msgspec)."""
    if not available():
        return None
    buf = np.frombuffer(view, np.uint8)
    cap = len(buf) // BYTES_PER_EVENT + 64
    while True:
        s = getattr(_local, "scratch", None)
        if s is None or s.cap < cap:
            s = _local.scratch = _Scratch(cap)
        n = _lib.ne_scan(
            buf.ctypes.data, len(buf), key, len(key), s.cap, s.pointers, s.n_tokens.ctypes.data
        )
        if n != -2:
            break
        cap = len(buf) // 2 + 64  # at least a byte and a comma an event
    if n < 0:
        return None
    tokens = [_token_array(buf, s, f, default) for f, default in enumerate(DEFAULTS)]
    return Scanned(
        n=int(n),
        buf=buf,
        local=[c[:n] for c in s.codes],
        tokens=tokens,
        us=[u[:n] for u in s.us],
        missing=[m[:n] for m in s.missing],
        time_off=[o[:n] for o in s.time_off],
        time_len=[t[:n] for t in s.time_len],
        args_off=s.args_off[:n],
        args_len=s.args_len[:n],
    )

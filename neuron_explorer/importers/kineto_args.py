"""The args fields that become columns: shapes, dtypes and flops of ops, correlation ids and
bytes of launches and device work, the sizes in memory samples. Each subset of events is decoded
in bulk (its args objects joined into JSON lines) into a small struct, never a dict, or read
by the native scanner (NATIVE_FIELDS) where its args are all of the plain form it reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pyarrow as pa

from . import kineto_decode as kd

NULL = msgspec.Raw(b"null")


class OpArgs(msgspec.Struct, gc=False):
    input_dims: msgspec.Raw = msgspec.field(default=kd.EMPTY, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=kd.EMPTY, name="Input type")
    flops: Any = None


class GpuArgs(msgspec.Struct, gc=False):
    correlation: Any = None
    bytes: Any = None


class MemArgs(msgspec.Struct, gc=False):
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    nbytes: Any = msgspec.field(default=None, name="Bytes")  # old traces: the change only


class LaneArgs(msgspec.Struct, gc=False):
    name: Any = None


def _op_columns(args: list[OpArgs | None]) -> tuple[pa.Array, ...]:
    return (
        kd.raw_column([a.input_dims if a else kd.EMPTY for a in args]),
        kd.raw_column([a.input_type if a else kd.EMPTY for a in args]),
        kd.ints([a.flops if a else None for a in args]),
    )


def _gpu_columns(args: list[GpuArgs | None]) -> tuple[pa.Array, ...]:
    return (
        kd.ints([a.correlation if a else None for a in args]),
        kd.ints([a.bytes if a else None for a in args]),
    )


def _mem_columns(args: list[MemArgs | None]) -> tuple[pa.Array, ...]:
    return (  # plain attribute reads: getattr by name per event costs a third more
        kd.ints([a.total_allocated if a else None for a in args]),
        kd.ints([a.total_reserved if a else None for a in args]),
        kd.ints([a.device_type if a else None for a in args]),
        kd.ints([a.device_id if a else None for a in args]),
        kd.ints([a.nbytes if a else None for a in args]),
    )


def _lane_columns(args: list[LaneArgs | None]) -> tuple[pa.Array, ...]:
    names = [a.name if a and isinstance(a.name, str) else None for a in args]
    return (pa.array(names, pa.string()),)


# subset name (see kineto_kinds.Roles.typed_subsets) -> (struct, its columns)
SUBSETS: dict[str, tuple[type, Callable[[list[Any]], tuple[pa.Array, ...]]]] = {
    "op": (OpArgs, _op_columns),  # shapes, dtypes, flops
    "gpu": (GpuArgs, _gpu_columns),  # correlation, bytes
    "mem": (MemArgs, _mem_columns),  # allocated, reserved, device type, device id, bytes
    "lane": (LaneArgs, _lane_columns),  # the name a thread_name / process_name event gives
}


# struct -> its columns' args keys, in to_columns' order, each with whether it is an integer
# (kd.ints) or a raw text (kd.raw_column): what the native scanner reads (kineto_native)
NATIVE_FIELDS: dict[type, tuple[tuple[bytes, bool], ...]] = {
    OpArgs: ((b"Input Dims", False), (b"Input type", False), (b"flops", True)),
    GpuArgs: ((b"correlation", True), (b"bytes", True)),
    MemArgs: tuple(
        (key, True)
        for key in (b"Total Allocated", b"Total Reserved", b"Device Type", b"Device Id", b"Bytes")
    ),
}


def typed_columns(raws: list[msgspec.Raw], struct: type, to_columns: Callable) -> tuple:
    """The columns `to_columns` makes of the args texts `raws` decoded into `struct` (None for
    an event without args, or with args that do not fit the struct)."""
    subset = [r or NULL for r in raws]
    return typed_lines(b"\n".join(subset), len(subset), lambda: subset, struct, to_columns)


def typed_lines(
    lines: bytes | bytearray, n: int, items: Callable[[], list], struct: type, to_columns: Callable
) -> tuple:
    """typed_columns of `n` args texts already joined as JSON lines (`items`: the texts one by
    one, for an odd args object)."""
    decoder = msgspec.json.Decoder(struct | None)
    try:
        decoded = decoder.decode_lines(lines) if n else []
    except msgspec.ValidationError:  # an odd args object: keep the rest, this one as None
        decoded = [_decode_or_none(decoder, r) for r in items()]
    return to_columns(decoded)


def _decode_or_none(decoder: msgspec.json.Decoder, raw: msgspec.Raw) -> Any:
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError:
        return None

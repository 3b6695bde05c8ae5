"""The runtime's events as rows of the events table, made Arrow tables a block at a time.

capture/merge.py decides each event's ids, times, step and parent; this module only lays one
event out in the events schema's column order (its shapes, dtypes and args as JSON text) and
gathers the rows into tables of `RowBlocks.BLOCK` rows.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from ..model.schema import EVENTS, conform
from .attribution import Attribution

_COLUMNS = tuple(c.name for c in EVENTS.columns)
_json_cache: dict[tuple, str] = {}


def json_text(value: tuple) -> str:
    """JSON text of a shapes or dtypes tuple; the same few tuples recur, so cache them."""
    text = _json_cache.get(value)
    if text is None:
        text = _json_cache[value] = json.dumps(value)
        if len(_json_cache) > 100_000:
            _json_cache.clear()
    return text


def _args(e: Any, layer: str) -> str | None:
    args = dict(e.args) if e.args else {}
    if layer == "host":
        args.setdefault("real_ns", e.host_end_ns - e.host_start_ns)
        args["modeled_ns"] = e.host_cost_ns
    if e.engine:
        args["engine"] = e.engine
    if e.seq_nr >= 0:
        args["seq_nr"] = e.seq_nr
    if e.is_backward:
        args["backward"] = True
    return json.dumps(args, default=str, sort_keys=True) if args else None


class RowBlocks:
    """Runtime events' rows made Arrow tables a block at a time: a real-size step's hundreds of
    thousands of DMA transfers are never all held as Python tuples and column lists at once
    (they were a third of a shapes-only rank's peak, docs/device.md)."""

    BLOCK = 32_768

    def __init__(self) -> None:
        self._rows: list[tuple] = []
        self._tables: list[pa.Table] = []

    def append(self, row: tuple) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.BLOCK:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            columns = dict(zip(_COLUMNS, map(list, zip(*self._rows, strict=True)), strict=True))
            self._rows = []
            self._tables.append(conform(EVENTS, columns))

    def tables(self) -> list[pa.Table]:
        self._flush()
        return self._tables


def add_row(rows: RowBlocks, rank: int, e: Any, eid: int, flow: int | None, layer: str, track: str, device: str,
         start: int, dur: int, parent: int | None, step: int | None, at: Attribution) -> None:  # fmt: skip
    """One runtime event as a row, in the order of the events schema's columns."""
    file, lineno, func = at.src or (None, None, None)
    mfile, mline, mfunc = at.model or (None, None, None)
    rows.append((
        eid, rank, layer, e.kind, e.name, track, device, start, max(dur, 0), parent, flow, step,
        at.stack_id, file, lineno, func, e.op_name or None,
        json_text(e.shapes) if e.shapes else None, json_text(e.dtypes) if e.dtypes else None,
        e.flops or None, e.bytes_read or None, e.bytes_written or None, _args(e, layer),
        at.module, mfile, mline, mfunc,
    ))  # fmt: skip

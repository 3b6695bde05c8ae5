"""A decoded range's events as columns (a Piece): from msgspec's event structs, or from the
native scanner's arrays (kineto_native) for a middle range it reads; either way the roles of
the events, their typed args and the rows' args texts are made here, the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress

import msgspec
import numpy as np
import pyarrow as pa

from . import kineto_decode as kd
from . import kineto_native as native
from .kineto_args import NATIVE_FIELDS, SUBSETS, typed_columns, typed_lines
from .kineto_kinds import LANE_NAME_EVENTS, MEMORY_EVENT, roles

WRAP_KEY = "~neuron-explorer-range"  # the key a range's events are wrapped in (kineto_ranges)
FIELDS = ("ph", "name", "cat", "pid", "tid", "id")  # factorized event fields


@dataclass
class Piece:
    """The columns of the events of one range (codes index the span's distinct values)."""

    codes: dict[str, np.ndarray]  # FIELDS -> int64 codes, -1 for null
    ts: kd.Times
    dur: kd.Times
    row_args: pa.Array  # args JSON text of the events that are rows
    typed: dict[str, tuple[pa.Array, ...]]  # kineto_args.SUBSETS -> columns


class _TimesHead(msgspec.Struct, gc=False):
    traceEvents: list[kd.TimesEvent]


class _TimesRange(msgspec.Struct, gc=False):
    events: list[kd.TimesEvent] = msgspec.field(name=WRAP_KEY)


def columns(
    evs: list[kd.Event],
    view: memoryview,
    first: bool,
    factorizers: dict[str, kd.Factorizer],
) -> Piece:
    """A range's events as columns; its args text and typed args fields decoded in bulk."""
    codes = {
        "ph": factorizers["ph"].codes([e.ph for e in evs]),
        "name": factorizers["name"].codes([e.name for e in evs]),
        "cat": factorizers["cat"].codes([e.cat for e in evs]),
        "pid": factorizers["pid"].codes([e.pid for e in evs]),
        "tid": factorizers["tid"].codes([e.tid for e in evs]),
        "id": factorizers["id"].codes([e.id for e in evs]),
    }
    ts, ts_text = kd.float_times([e.ts for e in evs])
    dur, dur_text = kd.float_times([e.dur for e in evs])
    if ts_text.any() or dur_text.any():
        _exact_times(view, first, ts, ts_text, dur, dur_text)
    args = [e.args for e in evs]

    def typed(mask: np.ndarray, struct: type, to_columns: Callable) -> tuple:
        # compress with a mask: a third of the time of indexing by numpy ints
        return typed_columns(list(compress(args, mask.tolist())), struct, to_columns)

    return _piece(
        codes,
        ts,
        dur,
        factorizers,
        typed,
        lambda m: kd.raw_column(list(compress(args, m.tolist()))),
    )


def scanned(view: memoryview, factorizers: dict[str, kd.Factorizer]) -> Piece | None:
    """A middle range's columns read by the native scanner (kineto_native), or None where it
    is not there or refuses the range."""
    sc = native.scan(view, WRAP_KEY.encode())
    if sc is None:
        return None
    try:  # every field's values before any is counted: a failure leaves the factorizers as
        values = [sc.values(i) for i in range(len(FIELDS))]  # they were
    except msgspec.DecodeError:
        return None
    codes = {
        f: factorizers[f].codes(v)[sc.local[i]]
        for i, (f, v) in enumerate(zip(FIELDS, values, strict=True))
    }
    # the missing flags are kept: copies, not views of the scanner's reused arrays
    ts, ts_text = kd.us_times(sc.us[0], sc.missing[0].copy())
    dur, dur_text = kd.us_times(sc.us[1], sc.missing[1].copy())
    for which, times, text in ((0, ts, ts_text), (1, dur, dur_text)):
        idx = np.flatnonzero(text)
        if idx.size:
            times.ns[idx] = kd.text_ns(sc.time_texts(which, idx), times.ns[idx])  # type: ignore[arg-type]

    def typed(mask: np.ndarray, struct: type, to_columns: Callable) -> tuple:
        idx = np.flatnonzero(mask)
        fields = NATIVE_FIELDS.get(struct)
        cols = sc.args_fields(idx, fields) if fields else None
        if cols is not None:  # the plain args read by the scanner, no object per event
            return tuple(cols)
        lines = sc.args_lines(idx)
        return typed_lines(lines, len(idx), lambda: sc.args_list(idx), struct, to_columns)

    return _piece(codes, ts, dur, factorizers, typed, lambda m: sc.args_column(np.flatnonzero(m)))


def _piece(
    codes: dict[str, np.ndarray],
    ts: kd.Times,
    dur: kd.Times,
    factorizers: dict[str, kd.Factorizer],
    typed: Callable[[np.ndarray, type, Callable], tuple],
    row_args: Callable[[np.ndarray], pa.Array],
) -> Piece:
    """A range's Piece from its codes and times: the roles of its events, their typed args
    (`typed` of a mask of events) and the args texts of its rows (`row_args` of a mask)."""
    ph = phases(factorizers["ph"].seen, codes["ph"])
    memory_code = factorizers["name"].get(MEMORY_EVENT, -2)
    lane_codes = [factorizers["name"].get(n, -2) for n in LANE_NAME_EVENTS]
    lane_name = np.isin(codes["name"], lane_codes)
    r = roles(ph, codes["cat"], factorizers["cat"].seen, codes["name"] == memory_code, lane_name)
    typed_cols = {key: typed(mask, *SUBSETS[key]) for key, mask in r.typed_subsets().items()}
    return Piece(codes, ts, dur, row_args(r.is_row), typed_cols)


def phases(values: list[str], codes: np.ndarray) -> np.ndarray:
    """Event phases as a fixed-width str array (ph is one or two letters; kept to four), as
    narrow as the longest (one letter: a quarter of the memory of four)."""
    width = min(4, max([1, *map(len, values)]))
    return np.array(values or [""], dtype=f"U{width}").reshape(-1)[codes]


def _exact_times(
    view: memoryview,
    first: bool,
    ts: kd.Times,
    ts_text: np.ndarray,
    dur: kd.Times,
    dur_text: np.ndarray,
) -> None:
    """Replace the times float64 may have rounded by their decimal text (a second, light
    decode of the range: only the ts and dur texts)."""
    if first:
        texts = msgspec.json.decode(view, type=_TimesHead).traceEvents
    else:
        texts = msgspec.json.decode(view, type=_TimesRange).events
    for times, which, attr in ((ts, ts_text, "ts"), (dur, dur_text, "dur")):
        idx = np.flatnonzero(which)
        if idx.size:
            raws = [getattr(texts[i], attr) for i in idx]
            times.ns[idx] = kd.text_ns(raws, times.ns[idx])

"""Map one torch.profiler (Kineto) trace onto the profile's tables.

Categories become kinds (kineto_kinds); everything is computed over whole columns: host
nesting, steps by containment, launches (runtime -> kernel through the `correlation` arg, the
same link Kineto draws as ac2g flows), forward -> backward ops (fwdbwd flows), python stacks.
Times are integer unix nanoseconds here; the caller shifts them to the profile's origin.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import BadInputError
from ..model.io import ROW_GROUP_ROWS
from ..vocab.intervals import NONE, containing, nearest, nest
from . import kineto_decode as kd
from . import kineto_lanes as kl
from . import pystacks
from .kineto_checks import MAX_BASE_NS, check_range, check_times
from .kineto_classes import Classes, classify
from .kineto_columns import give_back_free_memory, map_large_blocks, stream_extract
from .kineto_extract import Decoded, DecodeOptions, extract
from .kineto_frames import (
    RowColumn,
    compact,
    dict_rows,
    frames_used,
    narrow,
    one_array,
    row_index_type,
    row_indices,
    row_places,
    scattered,
    stack_columns,
)
from .kineto_kinds import KIND_NAMES, K, phase_is
from .kineto_links import FlowPoints, fwdbwd, launches
from .kineto_memory import memory_counters
from .kineto_patch import args_column
from .progress import Share, no_share


@dataclass
class FileData:
    """One trace file mapped to columns (times in unix ns, links as row indices)."""

    path: Path
    rank: int | None
    columns: dict[str, Any]  # event columns, row-aligned
    links: dict[str, np.ndarray]  # parent, flow_src, launch: row index or -1
    stacks: dict[str, pa.Array]
    counters: dict[str, Any]
    steps: list[tuple[int, int, int]]  # (step, start_unix_ns, dur_ns)
    devices: list[dict[str, Any]]
    meta: dict[str, Any]
    user_files: set[str] = field(default_factory=set)
    event_index: np.ndarray | None = None  # per row, its event's index in the file (if asked)


DECODE_SHARE = 0.6  # of a file's progress: reading and decoding it, then mapping


def load(
    path: Path,
    progress: Share | None = None,
    options: DecodeOptions | None = None,
    *,
    thread_names: bool = True,
    event_index: bool = False,
    decoded: Decoded | None = None,
) -> FileData:
    """Read, decode and map one trace file (`thread_names`: lanes named by the trace's
    thread_name metadata, else by tid alone; `event_index`: keep each row's event index)."""
    report = progress or no_share
    options = options or DecodeOptions()
    share: Share = lambda f, events=None: report(DECODE_SHARE * f, events)  # noqa: E731
    if decoded is not None:  # a chunk's columns: kineto_heap's setting, the chunked import's
        d = decoded
    elif options.memory_budget is None:
        d = extract(path, options, share)
    else:
        map_large_blocks()
        d = stream_extract(path, options.memory_budget, share, options.stream_range_bytes)
    report(DECODE_SHARE, d.n)
    c = classify(d)
    names = kl.metadata(d, np.flatnonzero(c.is_lane_name))
    base = _base_ns(path, d)
    sample_ts = d.ts.ns[np.flatnonzero(c.is_counter)] + base
    points = _fwdbwd_points(d, c)
    none = np.zeros(0, bool)  # not a view: a view would keep the column alive
    c = replace(c, is_flow=none, is_lane_name=none)  # read: let go
    r = _rows(path, d, c, names if thread_names else None)  # lets go of the events' times
    points = points.on_lanes(lambda events: r.lanes.host_lane_of(d, events))
    other = _other_tags(d, c, r)
    mem = d.typed["mem"]
    d.let_go_events()  # what the mapping reads on is the rows' columns, not every event's
    row_events = r.rows if event_index else None
    r = replace(r, rows=np.zeros(0, r.rows.dtype))  # events are no longer looked up by row
    step_no, frame_names = c.step_no, c.names
    del c
    counters = memory_counters(mem, sample_ts)
    del mem, sample_ts
    report(0.7)
    parent = _host_parents(r)
    links = _launch_links(d, r)
    d.typed.pop("gpu")  # the correlation ids: the links hold the bytes args
    step, steps = _steps(r, step_no, links)
    stacks = _stacks(frame_names, r, parent, links)
    report(0.8)
    is_op = r.kind == K["op"]
    flow_extra = fwdbwd(points, d.ids, r.track_code, r.start, r.dur, parent, is_op, links.flow_src)
    stacks = stacks.inherit_backward(links.flow_src, is_op, parent, links.dev_rows,
                                     links.launch[links.dev_rows])  # fmt: skip
    places = row_places(r.n, np.flatnonzero(is_op), links.gpu_rows)
    # the op and byte columns taken from one array each, not the decode's pieces (a take
    # three times faster: 4% of a chunk's mapping), but in the streaming import, whose peak
    # is held to 1.5x the file: joining them holds both at once (2 MB more at 100 MB)
    joined = decoded is not None or options.memory_budget is None
    columns = {
        **_base_columns(d, r, step),
        **stack_columns(stacks),
        "op_name": dict_rows(d.names, _op_name_code(r, parent, links)),
        **_op_columns(places, one_array(d.typed.pop("op"), joined)),
        **_byte_columns(r, places, one_array((links.nbytes,), joined)[0]),
        "args": args_column(d.take_row_args(), other, flow_extra),
    }
    used = frames_used(len(stacks.frames), stacks.user_frame, stacks.model_frame)
    if options.memory_budget is not None:
        give_back_free_memory()  # the mapping's small temporaries, before the write's
    if options.memory_budget is not None and decoded is None:
        # the write takes the rows a row group at a time: each block's int32 columns (256 KB)
        # and larger get mappings of their own, handed back as each block is written, instead
        # of staying on the heap beside the next (9 MB of the 100 MB benchmark trace's peak)
        map_large_blocks(ROW_GROUP_ROWS * 4)
    report(1.0)
    return FileData(
        path=path,
        rank=rank_of(d.trace.distributedInfo),
        columns=columns,
        links={"parent": narrow(parent), "flow_src": narrow(links.flow_src)},
        stacks=stacks.table,
        counters=counters,
        steps=steps,
        devices=list(d.trace.deviceProperties),
        meta=_meta(d.trace, names),
        user_files={stacks.frames[i].file for i in used},
        event_index=row_events,
    )


@dataclass(frozen=True)
class _Rows:
    """The events that are rows of the events table, with their times, lanes and devices."""

    rows: np.ndarray  # event index of each row
    n: int
    start: np.ndarray  # unix ns
    dur: np.ndarray
    kind: np.ndarray  # int8 code
    dev: np.ndarray  # bool: device layer
    name_code: np.ndarray
    track_code: np.ndarray
    track_dict: pa.Array
    device_code: np.ndarray
    device_dict: pa.Array
    lanes: kl.Lanes


def _rows(path: Path, d: Decoded, c: Classes, names: kl.Metadata | None) -> _Rows:
    rows = row_indices(c.is_row)  # held through the mapping: int32
    if rows.size == 0:
        raise BadInputError(path, "empty trace (no events in traceEvents)")
    check_times(path, d, rows, d.ts.missing[rows], "ts")
    check_times(path, d, rows, d.dur.missing[rows] & phase_is(d.ph[rows], "X"), "dur")
    base = _base_ns(path, d)
    samples = np.flatnonzero(c.is_counter)
    check_range(path, d, samples, d.ts.ns[samples] + base, np.zeros(samples.size, np.int64))
    # the events' times let go as the rows' are taken: a fifth of the decoded columns
    start = d.ts.ns[rows]
    start += base  # in place, as below: no second column of the rows
    d.ts = replace(d.ts, ns=np.zeros(0, np.int64))
    dur = d.dur.ns[rows]
    np.maximum(dur, 0, out=dur)
    d.dur = replace(d.dur, ns=np.zeros(0, np.int64))
    check_range(path, d, rows, start, dur)
    d.let_go_times()
    dev = c.device[rows]
    lanes = kl.lanes(d, rows, dev, names)
    device_code, device_dict = kl.devices(d, rows, dev, c.mtia)
    return _Rows(
        rows=rows,
        n=rows.size,
        start=start,
        dur=dur,
        kind=c.kind[rows],
        dev=dev,
        name_code=d.name_code[rows],
        track_code=lanes.code,
        track_dict=lanes.names,
        device_code=compact(device_code),
        device_dict=device_dict,
        lanes=lanes,
    )


def _base_ns(path: Path, d: Decoded) -> int:
    base = d.trace.baseTimeNanoseconds or 0
    if abs(base) >= MAX_BASE_NS:  # beyond int64 nanoseconds once the event times are added
        raise BadInputError(path, f"baseTimeNanoseconds {base} is out of range")
    return base


def _host_parents(r: _Rows) -> np.ndarray:
    """Host nesting, per track: the row index of each host row's enclosing row, or -1."""
    host = row_indices(~r.dev)
    end = r.start[host]
    end += r.dur[host]
    hp = nest(r.track_code[host], r.start[host], end)
    del end
    parent = np.full(r.n, NONE, dtype=row_index_type(r.n))
    inner = hp >= 0
    parent[host[inner]] = host[hp[inner]]
    return parent


@dataclass(frozen=True)
class _Links:
    """Runtime launches -> device work (the correlation arg)."""

    gpu_rows: np.ndarray  # runtime calls and device work: the rows with a correlation id
    nbytes: pa.ChunkedArray  # their `bytes` arg
    launch: np.ndarray  # per row: the runtime row that launched it, or -1
    dev_rows: np.ndarray  # device rows that have a launch
    flow_src: np.ndarray  # per row: the launching row for both ends of a launch, or -1


def _launch_links(d: Decoded, r: _Rows) -> _Links:
    gpu_rows = narrow(np.flatnonzero((r.kind == K["runtime"]) | r.dev))
    corr, nbytes = d.typed["gpu"]
    launch = launches(gpu_rows, corr, r.dev[gpu_rows], r.n)
    flow_src = np.full(r.n, NONE, dtype=row_index_type(r.n))
    linked = np.flatnonzero(launch >= 0)
    flow_src[linked] = launch[linked]
    flow_src[launch[linked]] = launch[linked]
    dev_rows = narrow(np.flatnonzero(r.dev & (launch >= 0)))
    return _Links(gpu_rows, nbytes, launch, dev_rows, flow_src)


def _steps(r: _Rows, step_no: np.ndarray, links: _Links) -> tuple[np.ndarray, list]:
    """Each row's step (host rows by containment of their start, device work its launch's,
    unlaunched device work by its own start) and the steps as (step, start, dur)."""
    step_rows = np.flatnonzero(r.kind == K["step"])
    numbers = step_no[r.name_code[step_rows]]
    starts, durs = r.start[step_rows], r.dur[step_rows]
    step = _step_of(r.start, starts, durs, numbers)
    step[r.dev] = NONE  # device work takes its launch's step
    step[links.dev_rows] = step[links.launch[links.dev_rows]]
    alone = np.flatnonzero(r.dev & (links.launch < 0))
    step[alone] = _step_of(r.start[alone], starts, durs, numbers)
    steps = sorted(
        (int(s), int(r.start[i]), int(r.dur[i])) for s, i in zip(numbers, step_rows, strict=True)
    )
    return compact(step), steps


def _fwdbwd_points(d: Decoded, c: Classes) -> FlowPoints:
    is_fwdbwd = c.is_flow & np.array([x.lower() == "fwdbwd" for x in d.cats], bool)[d.cat_code]
    return FlowPoints.of(d, np.flatnonzero(is_fwdbwd))


def _op_name_code(r: _Rows, parent: np.ndarray, links: _Links) -> np.ndarray:
    """op_name: ops are their own op; runtime calls take the enclosing op; device work its
    launch's."""
    is_op = r.kind == K["op"]
    op_of = nearest(parent, is_op, include_self=True)
    op_of[links.dev_rows] = op_of[links.launch[links.dev_rows]]
    code = np.where(op_of >= 0, r.name_code[np.clip(op_of, 0, None)], NONE)
    return compact(np.where(is_op | (r.kind == K["runtime"]) | r.dev, code, NONE))


def _stacks(names: list[str], r: _Rows, parent: np.ndarray, links: _Links) -> pystacks.Stacks:
    """Python stacks and source lines; device work takes its launch's."""
    is_py = r.kind == K["python"]
    py_names = np.unique(r.name_code[is_py])
    local_code = np.zeros(len(names), dtype=np.int32)
    local_code[py_names] = np.arange(len(py_names))
    stacks = pystacks.build(
        is_py, nearest(parent, is_py), local_code[r.name_code], [names[i] for i in py_names]
    )
    stacks = replace(stacks, stack_id=compact(stacks.stack_id), user_frame=compact(stacks.user_frame),
                     model_frame=compact(stacks.model_frame), module=compact(stacks.module))  # fmt: skip
    dev_rows, launch = links.dev_rows, links.launch
    return stacks.take_launch(dev_rows, launch[dev_rows])


def _base_columns(d: Decoded, r: _Rows, step: np.ndarray) -> dict[str, Any]:
    """The row columns, each made a block of rows at a time from its compact codes (one to
    four bytes a row held, not an Arrow column of int32 indices and a validity mask)."""
    return {
        "layer": dict_rows(pa.array(["host", "device"]), r.dev.view(np.int8)),
        "kind": dict_rows(KIND_NAMES, r.kind),
        "name": dict_rows(d.names, r.name_code),
        "track": dict_rows(r.track_dict, r.track_code),
        "device": dict_rows(r.device_dict, r.device_code),
        "start_ns": r.start,
        "dur_ns": r.dur,
        "step": RowColumn(lambda rows: pa.array(step[rows], pa.int32(), mask=step[rows] < 0)),
    }


def _op_columns(places: np.ndarray, typed: tuple) -> dict[str, Any]:
    shapes, dtypes, flops = scattered(places, False, *typed)
    return {"shapes": shapes, "dtypes": dtypes, "flops": flops}


def _byte_columns(r: _Rows, places: np.ndarray, nbytes: pa.ChunkedArray) -> dict[str, Any]:
    """Copies read and write their bytes; memsets only write them."""
    (col,) = scattered(places, True, nbytes)
    kind = r.kind

    def only(kinds: tuple[int, ...]) -> RowColumn:
        def make(rows: np.ndarray) -> pa.Array:
            values = col.take(rows)
            return pc.if_else(np.isin(kind[rows], kinds), values, pa.nulls(len(rows), pa.int64()))

        return RowColumn(make)

    return {
        "bytes_read": only((K["gpu_memcpy"],)),
        "bytes_written": only((K["gpu_memcpy"], K["gpu_memset"])),
    }


STEP_ROWS = 1 << 16  # rows whose steps are searched at once


def _step_of(
    starts: np.ndarray, step_start: np.ndarray, step_dur: np.ndarray, step_no: np.ndarray
) -> np.ndarray:
    """The number of the step holding each start (NONE: none), searched STEP_ROWS rows at a
    time: the search makes about five int64 columns of the rows it is given, 15 MB for the 100
    MB benchmark trace's 390,000 rows at once, at the mapping's peak."""
    order = np.argsort(step_start, kind="stable")  # once, not per block
    ss, se, numbers = step_start[order], step_start[order] + step_dur[order], step_no[order]
    out = np.empty(len(starts), np.int64)
    for i in range(0, len(starts), STEP_ROWS):
        k = containing(starts[i : i + STEP_ROWS], ss, se)
        out[i : i + STEP_ROWS] = np.where(
            k >= 0, numbers[np.clip(k, 0, None)] if numbers.size else 0, NONE
        )
    return out


def _other_tags(d: Decoded, c: Classes, r: _Rows) -> dict[int, tuple[str, str]]:
    """The rows of unknown categories, each with the cat and ph its args keep."""
    other = np.flatnonzero(r.kind == K["other"])
    events = r.rows[other]
    cats, phs = d.cat_code[events].tolist(), d.ph[events].tolist()
    return {i: (d.cats[k], str(p)) for i, k, p in zip(other.tolist(), cats, phs, strict=True)}


def rank_of(info: dict[str, Any] | None) -> int | None:
    """distributedInfo's rank, where it is an integer."""
    rank = (info or {}).get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _meta(trace: kd.Trace, names: kl.Metadata) -> dict[str, Any]:
    info = trace.distributedInfo or {}
    meta = {
        "process_names": names.processes,
        "trace_name": trace.traceName,
        "schema_version": trace.schemaVersion,
        "display_time_unit": trace.displayTimeUnit,
        "base_time_ns": trace.baseTimeNanoseconds,
        "host_name": trace.host_name,
        "distributed": {k: info[k] for k in ("backend", "rank", "world_size") if k in info},
    }
    return {k: v for k, v in meta.items() if v not in (None, {})}

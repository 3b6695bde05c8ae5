"""Map one torch.profiler (Kineto) trace onto the profile's tables.

Categories become kinds by the table below; everything is computed over whole columns: host
nesting, steps by containment, launches (runtime -> kernel through the `correlation` arg, the
same link Kineto draws as ac2g flows), forward -> backward ops (fwdbwd flows), python stacks.
Times are integer unix nanoseconds here; the caller shifts them to the profile's origin.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import BadInputError
from ..model.schema import KINDS
from . import kineto_decode as kd
from . import pystacks
from .kineto_links import fwdbwd, launches
from .nesting import NONE, containing, nearest, nest

# Kineto category (lower case) -> (kind, layer)
CATEGORIES: dict[str, tuple[str, str]] = {
    "cpu_op": ("op", "host"), "operator": ("op", "host"),
    "user_annotation": ("annotation", "host"),
    "python_function": ("python", "host"),
    "cuda_runtime": ("runtime", "host"), "cuda_driver": ("runtime", "host"),
    "runtime": ("runtime", "host"), "driver": ("runtime", "host"),
    "privateuse1_runtime": ("runtime", "host"), "privateuse1_driver": ("runtime", "host"),
    "kernel": ("gpu_kernel", "device"),
    "gpu_memcpy": ("gpu_memcpy", "device"), "memcpy": ("gpu_memcpy", "device"),
    "gpu_memset": ("gpu_memset", "device"), "memset": ("gpu_memset", "device"),
    "gpu_user_annotation": ("gpu_annotation", "device"),
    "cuda_sync": ("sync", "device"),
}  # fmt: skip
K = {name: i for i, name in enumerate(KINDS)}  # kind name -> code in the int8 kind arrays
KIND_NAMES = pa.array(KINDS, pa.string())
FLOW_PHASES = frozenset({"s", "f", "t"})
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
COLLECTIVE_PREFIXES = ("nccl:", "gloo:", "ucc:", "mpi:", "c10d::")
MEMORY_EVENT = "[memory]"
# c10::DeviceType values seen in [memory] events
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "cuda", 12: "xpu", 13: "mps", 20: "neuron"}


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


def _scatter(n: int, idx: np.ndarray, values: pa.Array) -> pa.Array:
    """A length-n array holding `values` at rows `idx` and null elsewhere."""
    where = np.full(n, -1, dtype=np.int64)
    where[idx] = np.arange(len(idx))
    return values.take(pa.array(where, mask=where < 0))


def _dict_take(dictionary: pa.Array, codes: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), dictionary)


MAX_BASE_NS = 2**62  # the year 2116; room left for the trace's own times in int64


def load(path: Path, progress: Callable[[float], None] | None = None) -> FileData:
    """Read, decode and map one trace file."""
    report = progress or (lambda f: None)
    d = kd.extract(path, report)
    report(0.6)
    c = _classify(d)
    name_dict, kind, layer_dev, step_no = c.names, c.kind, c.device, c.step_no
    phn, name_code, is_flow, is_counter = d.ph, d.name_code, c.is_flow, c.is_counter
    rows = np.flatnonzero(~is_flow & ~is_counter & (phn != "M"))
    if rows.size == 0:
        raise BadInputError(path, "empty trace (no events in traceEvents)")
    _check_times(path, d, name_dict, rows, d.ts.missing[rows], "ts")
    _check_times(path, d, name_dict, rows, d.dur.missing[rows] & (phn[rows] == "X"), "dur")
    base = d.trace.baseTimeNanoseconds or 0
    if abs(base) >= MAX_BASE_NS:  # beyond int64 nanoseconds once the event times are added
        raise BadInputError(path, f"baseTimeNanoseconds {base} is out of range")
    start = d.ts.ns[rows] + base
    dur_ns = np.maximum(d.dur.ns[rows], 0)
    n = rows.size
    r_kind = kind[rows]
    r_dev = layer_dev[rows]
    tid_text, pid_text = d.tids, d.pids
    track_dict = pa.concat_arrays(
        [kd.prefixed("thread ", tid_text), kd.prefixed("stream ", tid_text)]
    )
    track_code = d.tid_code[rows] + np.where(r_dev, len(d.tids), 0)
    device_dict = pa.concat_arrays([pa.array(["cpu"]), kd.prefixed("cuda:", pid_text)])
    device_code = np.where(r_dev, d.pid_code[rows] + 1, 0)
    report(0.7)

    # host nesting, per track
    host = np.flatnonzero(~r_dev)
    parent = np.full(n, NONE, dtype=np.int64)
    hp = nest(track_code[host], start[host], start[host] + dur_ns[host])
    parent[host] = np.where(hp >= 0, host[np.clip(hp, 0, None)], NONE)
    is_op = r_kind == K["op"]
    is_py = r_kind == K["python"]

    # steps, by containment of the start on this rank's host timeline
    step_rows = np.flatnonzero(r_kind == K["step"])
    steps_no = step_no[name_code[rows[step_rows]]]
    step = _step_of(start, start[step_rows], dur_ns[step_rows], steps_no)
    step = np.where(r_dev, NONE, step)

    # the args pass: text for every row, typed fields for ops, launches and memory samples
    op_rows = np.flatnonzero(is_op)
    gpu_rows = np.flatnonzero((r_kind == K["runtime"]) | r_dev)
    mem_idx = np.flatnonzero(is_counter)
    args_text, typed = kd.args_pass(
        d,
        rows,
        {
            "op": (OpArgs, rows[op_rows], _op_columns),
            "gpu": (GpuArgs, rows[gpu_rows], _gpu_columns),
            "mem": (MemArgs, mem_idx, _mem_columns),
        },
    )
    shapes, dtypes, flops = (_scatter(n, op_rows, col) for col in typed["op"])
    corr, nbytes = typed["gpu"]

    # launches: runtime call -> device work with the same correlation id
    launch = launches(gpu_rows, corr, r_dev[gpu_rows], n)
    flow_src = np.full(n, NONE, dtype=np.int64)
    linked = np.flatnonzero(launch >= 0)
    flow_src[linked] = launch[linked]
    flow_src[launch[linked]] = launch[linked]
    bytes_col = _scatter(n, gpu_rows, nbytes)
    is_xfer = np.isin(r_kind, [K["gpu_memcpy"], K["gpu_memset"]])
    bytes_read = pc.if_else(r_kind == K["gpu_memcpy"], bytes_col, pa.nulls(n, pa.int64()))
    bytes_written = pc.if_else(is_xfer, bytes_col, pa.nulls(n, pa.int64()))

    # op_name: ops are their own op; runtime calls take the enclosing op; device work its launch's
    op_of = nearest(parent, is_op, include_self=True)
    dev_rows = np.flatnonzero(r_dev & (launch >= 0))
    op_of[dev_rows] = op_of[launch[dev_rows]]
    step[dev_rows] = step[launch[dev_rows]]
    unlaunched = np.flatnonzero(r_dev & (launch < 0))
    step[unlaunched] = _step_of(start[unlaunched], start[step_rows], dur_ns[step_rows], steps_no)
    op_name_code = np.where(op_of >= 0, name_code[rows[np.clip(op_of, 0, None)]], NONE)
    op_name_code = np.where(is_op | (r_kind == K["runtime"]) | r_dev, op_name_code, NONE)

    # python stacks and source lines (device work takes its launch's)
    py_parent = nearest(parent, is_py)
    py_names = np.unique(name_code[rows[is_py]])
    local_code = np.zeros(len(name_dict), dtype=np.int64)
    local_code[py_names] = np.arange(len(py_names))
    stacks = pystacks.build(
        is_py, py_parent, local_code[name_code[rows]], [name_dict[i] for i in py_names]
    )
    stack_id = stacks.stack_id.copy()
    user_frame = stacks.user_frame.copy()
    stack_id[dev_rows] = stack_id[launch[dev_rows]]
    user_frame[dev_rows] = user_frame[launch[dev_rows]]
    report(0.8)

    is_fwdbwd = is_flow & np.array([c.lower() == "fwdbwd" for c in d.cats], dtype=bool)[d.cat_code]
    flow_extra = fwdbwd(d, np.flatnonzero(is_fwdbwd), rows, track_code, start, dur_ns, parent,
                        is_op, flow_src)  # fmt: skip
    frames = stacks.frames
    uf = pa.array(user_frame, mask=user_frame < 0)
    columns = {
        "layer": _dict_take(pa.array(["host", "device"]), r_dev.astype(np.int64)),
        "kind": _dict_take(KIND_NAMES, r_kind.astype(np.int64)),
        "name": _dict_take(d.names, name_code[rows]),
        "track": _dict_take(track_dict, track_code),
        "device": _dict_take(device_dict, device_code),
        "start_ns": start,
        "dur_ns": dur_ns,
        "step": pa.array(step, pa.int32(), mask=step < 0),
        "stack_id": stack_id,
        "src_file": pa.array([f.file for f in frames], pa.string()).take(uf),
        "src_line": pa.array([f.line for f in frames], pa.int32()).take(uf),
        "src_func": pa.array([f.func for f in frames], pa.string()).take(uf),
        "op_name": _dict_take(d.names, op_name_code),
        "shapes": shapes,
        "dtypes": dtypes,
        "flops": flops,
        "bytes_read": bytes_read,
        "bytes_written": bytes_written,
        "args": _args_column(d, args_text, rows, r_kind, flow_extra),
    }
    counters = _counters(typed["mem"], d.ts.ns[mem_idx] + base)
    steps = sorted(
        (int(s), int(start[r]), int(dur_ns[r])) for s, r in zip(steps_no, step_rows, strict=True)
    )
    used = np.unique(user_frame[user_frame >= 0])
    report(1.0)
    return FileData(
        path=path,
        rank=_rank(d.trace.distributedInfo),
        columns=columns,
        links={"parent": parent, "flow_src": flow_src},
        stacks=stacks.table,
        counters=counters,
        steps=steps,
        devices=list(d.trace.deviceProperties),
        meta=_meta(d.trace),
        user_files={frames[i].file for i in used},
    )


@dataclass(frozen=True)
class _Classes:
    """Per event: kind and layer; per distinct name: step number (-1 if not a step)."""

    names: list[str]
    kind: np.ndarray  # int8 index into KINDS
    device: np.ndarray  # bool: device layer
    step_no: np.ndarray  # by name code
    is_flow: np.ndarray  # bool: a flow event (ph s, f, t)
    is_counter: np.ndarray  # bool: a [memory] sample (goes to counters)


def _classify(d: kd.Decoded) -> _Classes:
    """Kinds from the category table, refined by name (steps, collectives), decided once per
    distinct category and name and spread to events by their codes."""
    names: list[str] = d.names.to_pylist()
    by_cat = [CATEGORIES.get(c.lower(), ("other", "host")) for c in d.cats]
    kind = np.array([K[k] for k, _ in by_cat] or [K["other"]], dtype=np.int8)[d.cat_code]
    device = np.array([layer == "device" for _, layer in by_cat] or [False])[d.cat_code]
    step_no = np.array([_step_number(s) for s in names], dtype=np.int64)
    coll_name = np.array([s.lower().startswith(COLLECTIVE_PREFIXES) for s in names], dtype=bool)
    nccl = np.array(["nccl" in s.lower() for s in names], dtype=bool)
    memory = np.array([s == MEMORY_EVENT for s in names], dtype=bool)
    if d.n:
        code = d.name_code
        annotation = kind == K["annotation"]
        kind[annotation & (step_no[code] >= 0)] = K["step"]
        kind[annotation & coll_name[code]] = K["collective"]
        kind[(kind == K["gpu_kernel"]) & nccl[code]] = K["collective"]
    is_flow = np.isin(d.ph, list(FLOW_PHASES))
    is_counter = (memory[d.name_code] if d.n else np.zeros(0, bool)) & (d.ph != "X")
    return _Classes(names, kind, device, step_no, is_flow, is_counter)


def _step_of(
    starts: np.ndarray, step_start: np.ndarray, step_dur: np.ndarray, step_no: np.ndarray
) -> np.ndarray:
    k = containing(starts, step_start, step_start + step_dur)
    return np.where(k >= 0, step_no[np.clip(k, 0, None)] if step_no.size else 0, NONE)


def _step_number(name: str) -> int:
    m = STEP_NAME.match(name)
    return int(m.group(1)) if m else -1


def _check_times(
    path: Path, d: kd.Decoded, names: list[str], rows: np.ndarray, bad: np.ndarray, what: str
) -> None:
    """Raise for the first of `rows` whose time value `what` is missing or not a number."""
    if bad.any():
        i = int(rows[int(np.argmax(bad))])
        name = names[d.name_code[i]]
        raise BadInputError(
            path, f"event #{i} ({name!r}, ph {str(d.ph[i])!r}) has no {what!r} time"
        )


def _args_column(
    d: kd.Decoded, col: pa.Array, rows: np.ndarray, kind: np.ndarray, extra: dict[int, str]
) -> pa.Array:
    """The events' args as JSON text; unknown categories also keep their cat and ph, and rows
    whose fwdbwd flow could not take flow_id keep the Kineto flow id."""
    patch = sorted(set(np.flatnonzero(kind == K["other"]).tolist()) | set(extra))
    if not patch:
        return col
    texts = []
    for r in patch:
        raw = col[r].as_py()
        a = msgspec.json.decode(raw) if raw else {}
        a = a if isinstance(a, dict) else {"args": a}
        if kind[r] == K["other"]:
            e = rows[r]
            a = {"cat": d.cats[d.cat_code[e]], "ph": str(d.ph[e]), **a}
        if r in extra:
            a["fwdbwd_flow"] = extra[r]
        texts.append(msgspec.json.encode(a).decode())
    mask = np.zeros(len(rows), dtype=bool)
    mask[patch] = True
    return pc.replace_with_mask(col, pa.array(mask), pa.array(texts, col.type))


def _op_columns(args: list[OpArgs | None]) -> tuple[pa.Array, pa.Array, pa.Array]:
    return (
        kd.raw_column([a.input_dims if a else kd.EMPTY for a in args]),
        kd.raw_column([a.input_type if a else kd.EMPTY for a in args]),
        kd.ints([a.flops if a else None for a in args]),
    )


def _gpu_columns(args: list[GpuArgs | None]) -> tuple[pa.Array, pa.Array]:
    return (
        kd.ints([a.correlation if a else None for a in args]),
        kd.ints([a.bytes if a else None for a in args]),
    )


def _mem_columns(args: list[MemArgs | None]) -> tuple[pa.Array, ...]:
    fields = ("total_allocated", "total_reserved", "device_type", "device_id")
    return tuple(kd.ints([getattr(a, f) if a else None for a in args]) for f in fields)


def _counters(mem: tuple[pa.Array, ...], ts: np.ndarray) -> dict[str, Any]:
    """[memory] instant events -> memory_allocated and memory_reserved samples per device."""
    alloc, reserved, dtype, did = mem
    t = pc.fill_null(dtype, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    i = pc.fill_null(did, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    uniq, inverse = np.unique(np.stack([t, i], axis=1).reshape(-1, 2), axis=0, return_inverse=True)
    labels = pa.array([_device_label(int(a), int(b)) for a, b in uniq], pa.string())
    track = labels.take(pa.array(inverse.reshape(-1).astype(np.int64)))
    parts: dict[str, list] = {"track": [], "name": [], "ts_ns": [], "value": []}
    for name, values in (("memory_allocated", alloc), ("memory_reserved", reserved)):
        ok = pc.is_valid(values)
        parts["track"].append(track.filter(ok))
        parts["name"].append(pa.array([name] * int(pc.sum(ok).as_py() or 0), pa.string()))
        parts["ts_ns"].append(ts[ok.to_numpy(zero_copy_only=False)])
        parts["value"].append(values.filter(ok).cast(pa.float64()))
    return {
        "track": pa.concat_arrays(parts["track"]),
        "name": pa.concat_arrays(parts["name"]),
        "ts_ns": np.concatenate(parts["ts_ns"]),
        "value": pa.concat_arrays(parts["value"]),
    }


def _device_label(dtype: int | None, index: int | None) -> str:
    kind = DEVICE_TYPES.get(dtype if dtype is not None else 0, f"device{dtype}")
    return kind if kind == "cpu" or index is None or index < 0 else f"{kind}:{index}"


def _rank(info: dict[str, Any] | None) -> int | None:
    rank = (info or {}).get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _meta(trace: kd.Trace) -> dict[str, Any]:
    info = trace.distributedInfo or {}
    meta = {
        "trace_name": trace.traceName,
        "schema_version": trace.schemaVersion,
        "display_time_unit": trace.displayTimeUnit,
        "base_time_ns": trace.baseTimeNanoseconds,
        "host_name": trace.host_name,
        "distributed": {k: info[k] for k in ("backend", "rank", "world_size") if k in info},
    }
    return {k: v for k, v in meta.items() if v not in (None, {})}

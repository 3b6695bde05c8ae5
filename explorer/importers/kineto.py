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


def _decode_subset(struct: type, raws: list[msgspec.Raw]) -> list[Any]:
    if not raws:
        return []
    body = b",".join(r if len(r) else b"null" for r in raws)
    return msgspec.json.decode(b"[" + body + b"]", type=list[struct | None])


def _scatter(n: int, idx: np.ndarray, values: pa.Array) -> pa.Array:
    """A length-n array holding `values` at rows `idx` and null elsewhere."""
    where = np.full(n, -1, dtype=np.int64)
    where[idx] = np.arange(len(idx))
    return values.take(pa.array(where, mask=where < 0))


def _dict_take(dictionary: pa.Array, codes: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32(), mask=codes < 0), dictionary)


def load(path: Path, progress: Callable[[float], None] | None = None) -> FileData:
    """Read, decode and map one trace file."""
    report = progress or (lambda f: None)
    buf = kd.read_bytes(path)
    report(0.25)
    trace = kd.decode(path, buf)
    report(0.55)
    evs = trace.traceEvents
    n_all = len(evs)
    ph = pa.array([e.ph for e in evs], pa.string())
    cat = pa.array([e.cat for e in evs], pa.string()).dictionary_encode()
    names = pa.array([e.name for e in evs], pa.string()).dictionary_encode()
    name_dict: list[str] = names.dictionary.to_pylist()
    name_code = names.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    cat_dict: list[str] = cat.dictionary.to_pylist()
    cat_code = cat.indices.to_numpy(zero_copy_only=False).astype(np.int64)

    kinds = ["other"] * len(cat_dict)
    layers = ["host"] * len(cat_dict)
    for i, c in enumerate(cat_dict):
        kinds[i], layers[i] = CATEGORIES.get(c.lower(), ("other", "host"))
    kind = np.array(kinds, dtype=object)[cat_code] if n_all else np.zeros(0, dtype=object)
    layer_dev = np.array([x == "device" for x in layers], dtype=bool)[cat_code]
    step_no = np.array([_step_number(s) for s in name_dict], dtype=np.int64)
    is_coll_name = np.array([s.lower().startswith(COLLECTIVE_PREFIXES) for s in name_dict])
    is_nccl = np.array(["nccl" in s.lower() for s in name_dict], dtype=bool)
    is_mem = np.array([s == MEMORY_EVENT for s in name_dict], dtype=bool)
    phn = ph.to_numpy(zero_copy_only=False)
    if n_all:
        kind[(kind == "annotation") & (step_no[name_code] >= 0)] = "step"
        kind[(kind == "annotation") & is_coll_name[name_code]] = "collective"
        kind[(kind == "gpu_kernel") & is_nccl[name_code]] = "collective"
    is_flow = np.isin(phn, list(FLOW_PHASES))
    is_counter = is_mem[name_code] & (phn != "X")
    is_row = ~is_flow & ~is_counter & (phn != "M")

    ts = kd.micros_to_ns(kd.raw_column([e.ts for e in evs]))
    rows = np.flatnonzero(is_row)
    if rows.size == 0:
        raise BadInputError(path, "empty trace (no events in traceEvents)")
    _check_times(path, evs, rows, ts.bad[rows], "ts")
    dur = kd.micros_to_ns(kd.raw_column([evs[i].dur for i in rows]))
    _check_times(path, evs, rows, dur.bad & (phn[rows] == "X"), "dur")
    base = trace.baseTimeNanoseconds or 0
    start = ts.ns[rows] + base
    dur_ns = np.where(dur.bad, 0, np.maximum(dur.ns, 0))
    n = rows.size
    r_kind = kind[rows]
    r_dev = layer_dev[rows]
    pid = kd.unquote(kd.raw_column([evs[i].pid for i in rows]))
    tid = kd.unquote(kd.raw_column([evs[i].tid for i in rows]))
    track = pc.if_else(
        r_dev,
        kd.prefixed("stream ", tid),
        kd.prefixed("thread ", tid),
    )
    device = pc.if_else(r_dev, kd.prefixed("cuda:", pid), pa.scalar("cpu", pid.type))
    report(0.65)

    # host nesting, per track
    host = np.flatnonzero(~r_dev)
    track_code = pc.dictionary_encode(track).indices.to_numpy(zero_copy_only=False)
    parent = np.full(n, NONE, dtype=np.int64)
    hp = nest(track_code[host].astype(np.int64), start[host], start[host] + dur_ns[host])
    parent[host] = np.where(hp >= 0, host[np.clip(hp, 0, None)], NONE)
    is_op = r_kind == "op"
    is_py = r_kind == "python"

    # steps, by containment of the start on this rank's host timeline
    step_rows = np.flatnonzero(r_kind == "step")
    steps_no = step_no[name_code[rows[step_rows]]]
    inside = containing(start, start[step_rows], start[step_rows] + dur_ns[step_rows])
    step = np.where(inside >= 0, steps_no[np.clip(inside, 0, None)] if steps_no.size else 0, NONE)
    step = np.where(r_dev, NONE, step)

    # op arguments: shapes, dtypes, flops
    op_rows = np.flatnonzero(is_op)
    op_args = _decode_subset(OpArgs, [evs[i].args for i in rows[op_rows]])
    shapes = _scatter(n, op_rows, kd.raw_column([a.input_dims if a else kd.EMPTY for a in op_args]))
    dtypes = _scatter(n, op_rows, kd.raw_column([a.input_type if a else kd.EMPTY for a in op_args]))
    flops = _scatter(n, op_rows, kd.ints([a.flops if a else None for a in op_args]))
    del op_args

    # launches: runtime call -> device work with the same correlation id
    gpu_rows = np.flatnonzero((r_kind == "runtime") | r_dev)
    gpu_args = _decode_subset(GpuArgs, [evs[i].args for i in rows[gpu_rows]])
    corr = kd.ints([a.correlation if a else None for a in gpu_args])
    nbytes = kd.ints([a.bytes if a else None for a in gpu_args])
    del gpu_args
    launch = launches(gpu_rows, corr, r_dev[gpu_rows], n)
    flow_src = np.full(n, NONE, dtype=np.int64)
    linked = np.flatnonzero(launch >= 0)
    flow_src[linked] = launch[linked]
    flow_src[launch[linked]] = launch[linked]
    bytes_col = _scatter(n, gpu_rows, nbytes)
    is_xfer = np.isin(r_kind, ["gpu_memcpy", "gpu_memset"])
    bytes_read = pc.if_else(r_kind == "gpu_memcpy", bytes_col, pa.nulls(n, pa.int64()))
    bytes_written = pc.if_else(is_xfer, bytes_col, pa.nulls(n, pa.int64()))

    # op_name: ops are their own op; runtime calls take the enclosing op; device work its launch's
    op_of = nearest(parent, is_op, include_self=True)
    dev_rows = np.flatnonzero(r_dev & (launch >= 0))
    op_of[dev_rows] = op_of[launch[dev_rows]]
    step[dev_rows] = step[launch[dev_rows]]
    unlaunched = np.flatnonzero(r_dev & (launch < 0))
    if unlaunched.size and step_rows.size:
        k = containing(start[unlaunched], start[step_rows], start[step_rows] + dur_ns[step_rows])
        step[unlaunched] = np.where(k >= 0, steps_no[np.clip(k, 0, None)], NONE)
    op_name_code = np.where(op_of >= 0, name_code[rows[np.clip(op_of, 0, None)]], NONE)
    op_name_code = np.where(is_op | (r_kind == "runtime") | r_dev, op_name_code, NONE)

    # python stacks and source lines (device work takes its launch's)
    py_parent = nearest(parent, is_py)
    py_names = np.unique(name_code[rows[is_py]])
    local_code = np.full(len(name_dict), 0, dtype=np.int64)
    local_code[py_names] = np.arange(len(py_names))
    stacks = pystacks.build(
        is_py, py_parent, local_code[name_code[rows]], [name_dict[i] for i in py_names]
    )
    stack_id = stacks.stack_id.copy()
    user_frame = stacks.user_frame.copy()
    stack_id[dev_rows] = stack_id[launch[dev_rows]]
    user_frame[dev_rows] = user_frame[launch[dev_rows]]
    report(0.8)

    fwd_ts = ts.ns + base
    is_fwdbwd = is_flow & (np.array([c.lower() == "fwdbwd" for c in cat_dict])[cat_code])
    flow_extra = fwdbwd(evs, phn, np.flatnonzero(is_fwdbwd), fwd_ts, rows, track, start,
                        dur_ns, parent, is_op, flow_src)  # fmt: skip
    args = _args_column(evs, rows, r_kind, cat_dict, cat_code, phn, flow_extra)
    frames = stacks.frames
    ff = pa.array([f.file for f in frames], pa.string())
    fl = pa.array([f.line for f in frames], pa.int32())
    fn = pa.array([f.func for f in frames], pa.string())
    uf = pa.array(user_frame, mask=user_frame < 0)
    columns = {
        "layer": pa.array(np.where(r_dev, "device", "host")),
        "kind": pa.array(r_kind.astype(str)),
        "name": _dict_take(names.dictionary, name_code[rows]),
        "track": track.cast(pa.string()),
        "device": device.cast(pa.string()),
        "start_ns": start,
        "dur_ns": dur_ns,
        "step": pa.array(step, pa.int32(), mask=step < 0),
        "stack_id": stack_id,
        "src_file": ff.take(uf),
        "src_line": fl.take(uf),
        "src_func": fn.take(uf),
        "op_name": _dict_take(names.dictionary, op_name_code),
        "shapes": shapes.cast(pa.string()),
        "dtypes": dtypes.cast(pa.string()),
        "flops": flops,
        "bytes_read": bytes_read,
        "bytes_written": bytes_written,
        "args": args,
    }
    counters = _counters(evs, np.flatnonzero(is_counter), ts.ns + base)
    steps = sorted(
        (int(s), int(start[r]), int(dur_ns[r])) for s, r in zip(steps_no, step_rows, strict=True)
    )
    used = np.unique(user_frame[user_frame >= 0])
    report(1.0)
    return FileData(
        path=path,
        rank=_rank(trace.distributedInfo),
        columns=columns,
        links={"parent": parent, "flow_src": flow_src},
        stacks=stacks.table,
        counters=counters,
        steps=steps,
        devices=list(trace.deviceProperties),
        meta=_meta(trace),
        user_files={frames[i].file for i in used},
    )


def _step_number(name: str) -> int:
    m = STEP_NAME.match(name)
    return int(m.group(1)) if m else -1


def _check_times(path: Path, evs: list, rows: np.ndarray, bad: np.ndarray, what: str) -> None:
    """Raise for the first of `rows` whose time value `what` is missing or not a number."""
    if bad.any():
        i = int(rows[int(np.argmax(bad))])
        e = evs[i]
        raise BadInputError(
            path, f"event #{i} ({e.name!r}, ph {e.ph!r}) has no valid {what!r} (a number, in us)"
        )


def _args_column(
    evs: list,
    rows: np.ndarray,
    kind: np.ndarray,
    cat_dict: list[str],
    cat_code: np.ndarray,
    phn: np.ndarray,
    extra: dict[int, str],
) -> pa.Array:
    """The events' args as JSON text; unknown categories also keep their cat and ph, and rows
    whose fwdbwd flow could not take flow_id keep the Kineto flow id."""
    col = kd.raw_column([evs[i].args for i in rows]).cast(pa.string())
    patch = sorted(set(np.flatnonzero(kind == "other").tolist()) | set(extra))
    if not patch:
        return col
    texts = []
    for r in patch:
        raw = evs[rows[r]].args
        d = msgspec.json.decode(raw) if len(raw) else {}
        d = d if isinstance(d, dict) else {"args": d}
        if kind[r] == "other":
            d = {"cat": cat_dict[cat_code[rows[r]]], "ph": str(phn[rows[r]]), **d}
        if r in extra:
            d["fwdbwd_flow"] = extra[r]
        texts.append(msgspec.json.encode(d).decode())
    mask = np.zeros(len(rows), dtype=bool)
    mask[patch] = True
    return pc.replace_with_mask(col, pa.array(mask), pa.array(texts, pa.string()))


def _counters(evs: list, idx: np.ndarray, ts_unix: np.ndarray) -> dict[str, Any]:
    """[memory] instant events -> memory_allocated and memory_reserved samples per device."""
    margs = _decode_subset(MemArgs, [evs[i].args for i in idx])
    alloc = kd.ints([a.total_allocated if a else None for a in margs])
    reserved = kd.ints([a.total_reserved if a else None for a in margs])
    dtype = kd.ints([a.device_type if a else None for a in margs])
    did = kd.ints([a.device_id if a else None for a in margs])
    t = pc.fill_null(dtype, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    d = pc.fill_null(did, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    uniq, inverse = np.unique(np.stack([t, d], axis=1).reshape(-1, 2), axis=0, return_inverse=True)
    labels = pa.array([_device_label(int(a), int(b)) for a, b in uniq], pa.string())
    track = labels.take(pa.array(inverse.reshape(-1).astype(np.int64)))
    ts = ts_unix[idx]
    parts = {"track": [], "name": [], "ts_ns": [], "value": []}
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

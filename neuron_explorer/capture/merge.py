"""Merge torch.profiler's host events with the neuron runtime's events on one clock.

Host events come from the Kineto importer (real time). Runtime host calls (launch, compile,
fallback, copy, sync) become host events nested in the framework op that made them; device
kernels, instructions and DMAs go on their device tracks with the launch's flow id, the user
source line, and the step of their launch. Backward work with no user frame takes the line of
the forward op with the same autograd sequence number. See clock.py for the time mapping.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.manifest import Step
from ..model.schema import COUNTERS, EVENTS, conform
from ..vocab.intervals import innermost_parents, step_of
from ..vocab.kinds import FRAMEWORK_KINDS, NEURON_DEVICE_KINDS, NEURON_HOST_KINDS
from .attribution import Attributor
from .clock import Call, HostClock
from .host import (
    close_optimizer_spans,
    column_array,
    column_list,
    drop_own_frames,
    drop_simulator_events,
    python_files_named_now,
    steps_from_markers,
    without_stop_marker,
)
from .merge_rows import RowBlocks, add_row, json_text

DEVICE = "neuron:0"
HOST_KINDS = frozenset(NEURON_HOST_KINDS)
DEVICE_KINDS = frozenset(NEURON_DEVICE_KINDS)


@dataclass(frozen=True)
class Merged:
    events: pa.Table
    counters: pa.Table
    steps: tuple[Step, ...]
    removed_ns: int  # simulator time cut from the host timeline
    stacks: pa.Table  # the runtime events' stacks (stack ids from `first_stack_id` on)
    # simulator time cut before the window: this process's modeled clock (real minus every cut,
    # the clock the ranks of a job share) is origin_unix_ns - cut_before_ns + start_ns
    cut_before_ns: int = 0


def normalize_calls(calls: Sequence[Any]) -> list[Any]:
    """Put each eager compile first in its launching call, on one consistent clock.

    The runtime models a first-use launch as compile then launch from the call's start, but
    may record the compile at its real span inside the call and the launch without it. Here
    the compile starts with the call (zero real span, its modeled cost) and the launch follows
    it, spanning the whole call: the running cut after the pair is unchanged.
    """
    out = sorted(calls, key=lambda e: e.id)
    last_on_thread: dict[int, int] = {}
    for i, e in enumerate(out):
        j = last_on_thread.get(e.tid)
        last_on_thread[e.tid] = i
        if j is None or e.kind != "runtime" or out[j].kind != "compile":
            continue
        c = out[j]
        if c.op_name != e.op_name or not e.host_start_ns <= c.host_start_ns <= e.host_end_ns + (
            c.host_end_ns - c.host_start_ns
        ):
            continue
        compile_real = c.host_end_ns - c.host_start_ns
        out[j] = replace(
            c, host_start_ns=e.host_start_ns, host_end_ns=e.host_start_ns,
            args={**c.args, "real_ns": compile_real},
        )  # fmt: skip
        out[i] = replace(
            e, host_end_ns=e.host_end_ns + compile_real,
            cut_before_ns=c.cut_before_ns - c.host_cost_ns,
            args={**e.args, "real_ns": e.host_end_ns - e.host_start_ns},
        )  # fmt: skip
    return out


def in_window(runtime: Sequence[Any], lo_ns: int, hi_ns: int) -> Sequence[Any]:
    """The runtime events of the recorded window (real unix ns): host calls made in it, and
    the device work they launched; by id. Drained events (backend/runtime/drained.py) stay
    so, their kernels' instruction rows built only when read."""
    calls = [
        e
        for e in whole(runtime)
        if e.host_start_ns is not None and lo_ns <= e.host_start_ns <= hi_ns
    ]
    flows = {e.flow_id for e in calls if e.flow_id}
    if hasattr(runtime, "select"):
        ids = {e.id for e in calls}
        return runtime.select(lambda e: e.id in ids or (e.host_start_ns is None and (
            not e.flow_id or e.flow_id in flows))).sorted_by_id()  # fmt: skip
    work = [e for e in runtime if e.host_start_ns is None and (not e.flow_id or e.flow_id in flows)]
    return sorted([*calls, *work], key=lambda e: e.id)


def whole(runtime: Sequence[Any]) -> Sequence[Any]:
    """The runtime events without kernels' instruction and DMA rows where they are drained
    events (whose `whole()` builds none of them); else all of them."""
    return runtime.whole() if hasattr(runtime, "whole") else runtime


class _Where:
    """The events of `runtime` that `keep` accepts, read again at each pass: a drained step's
    instruction events are built while read, never all held."""

    def __init__(self, runtime: Sequence[Any], keep: Any) -> None:
        self.runtime, self.keep = runtime, keep

    def __iter__(self) -> Any:
        keep = self.keep
        return (e for e in self.runtime if keep(e))


def merge(
    host: pa.Table,
    origin_unix_ns: int,
    runtime: Sequence[Any],
    device: str = DEVICE,
    first_stack_id: int = 0,
) -> Merged:
    """Host events (EVENTS schema, real clock since `origin_unix_ns`) plus the runtime's events
    -> events and counters on one clock, with the steps and the runtime's stacks."""
    host = python_files_named_now(host)
    host = close_optimizer_spans(without_stop_marker(drop_own_frames(host)))
    rank = int(host.column("rank")[0].as_py()) if host.num_rows else 0  # one process, one rank
    built = whole(runtime)  # all but kernels' instruction and DMA rows (drained.py)
    calls = normalize_calls(
        [e for e in built if e.kind in HOST_KINDS and e.host_start_ns is not None]
    )
    work: Iterable[Any] = _Where(
        runtime, lambda e: e.kind in DEVICE_KINDS and e.device_start_ns is not None
    )  # drained: its instruction events are built at each pass, never all held
    if built is runtime:
        work = list(work)
    memory = [e for e in built if e.kind == "memory" and e.host_start_ns is not None]
    # garbage-collector pauses outside the backend's calls: simulator time, cut, no event
    # and metadata ops' spans ("cut"): no runtime cost, so all of it is simulator time
    pauses = [e for e in built if e.kind in ("gc", "cut") and e.host_start_ns is not None]
    # what torch recorded inside an op's cut is the simulator's too (a factory's CPU payload,
    # the host-cost calibration's views: runtime/hostcost.py); not an autograd hand-off's
    # (no op), which is a wait of the caller's
    cuts = [e for e in pauses if e.kind == "cut" and e.op_name]
    host = drop_simulator_events(host, [*calls, *cuts], origin_unix_ns)

    # The runtime's modeled clock is real time minus every cut since the process started;
    # cut0, the total when this window began, is the cut_before of its first recorded call.
    first = min([*calls, *pauses], key=lambda e: e.id, default=None)
    cut0 = first.cut_before_ns if first is not None else 0
    clock = HostClock(
        [Call(e.host_start_ns - origin_unix_ns, e.host_end_ns - origin_unix_ns, e.host_cost_ns,
              e.cut_before_ns) for e in [*calls, *pauses]],
        cut0,
    )  # fmt: skip
    device_offset = origin_unix_ns - cut0

    h_start = column_array(host, "start_ns").astype(np.int64)
    h_end = h_start + column_array(host, "dur_ns").astype(np.int64)
    h_start, h_end = clock.map(h_start), clock.map(h_end)
    host = host.set_column(host.schema.get_field_index("start_ns"), "start_ns", pa.array(h_start))
    host = host.set_column(
        host.schema.get_field_index("dur_ns"), "dur_ns", pa.array(h_end - h_start)
    )

    host = steps_from_markers(host)
    steps_start, steps_end, steps_num = _step_spans(host, h_start, h_end)
    next_id = int(pc.max(host.column("id")).as_py() or 0) + 1 if host.num_rows else 1
    ids, flows, d_start = _new_ids(calls, work, next_id)

    # Runtime calls on the host: mapped times, nested under the innermost host event.
    # Exactly where the runtime's clock put each call: its start minus the cut before it.
    c_start = np.array(
        [e.host_start_ns - e.cut_before_ns - device_offset for e in calls], dtype=np.int64
    )
    c_end = c_start + np.array([max(e.host_cost_ns, 0) for e in calls], dtype=np.int64)
    tracks = np.array(
        [*column_list(host, "track"), *[f"thread {e.tid}" for e in calls]], dtype=object
    )
    all_start = np.concatenate([h_start, c_start])
    all_end = np.concatenate([h_end, c_end])
    parent_ok = np.ones(len(all_start), dtype=bool)
    parents = innermost_parents(tracks, all_start, all_end, parent_ok)[host.num_rows :]
    host_ids = column_array(host, "id")
    n_host = host.num_rows

    def parent_id(p: int) -> int | None:
        if p < 0:
            return None
        return int(host_ids[p]) if p < n_host else ids[calls[p - n_host].id]

    src = Attributor(built, first_stack_id)  # instruction events: their kernel's attribution
    rows = RowBlocks()
    flow_step: dict[int, int] = {}
    call_steps = step_of(c_start, steps_start, steps_end, steps_num)
    for i, e in enumerate(calls):
        line = src.of(e)
        step = int(call_steps[i]) if call_steps[i] >= 0 else None
        if e.flow_id and step is not None:
            flow_step.setdefault(flows[e.flow_id], step)
        add_row(rows, rank, e, ids[e.id], flows.get(e.flow_id), "host", f"thread {e.tid}", "cpu", int(c_start[i]),
             int(c_end[i] - c_start[i]), parent_id(int(parents[i])), step, line)  # fmt: skip

    d_start -= device_offset
    d_steps = step_of(d_start, steps_start, steps_end, steps_num)
    for i, e in enumerate(work):
        flow = flows.get(e.flow_id)
        step = flow_step.get(flow) if flow is not None else None
        if step is None and d_steps[i] >= 0:
            step = int(d_steps[i])
        pid = ids.get(e.parent_id) if e.parent_id is not None else None
        add_row(rows, rank, e, ids[e.id], flow, "device", e.track or "kernels", device, int(d_start[i]),
             int(e.device_dur_ns or 0), pid, step, src.of(e))  # fmt: skip

    host = _fill_op_lines(host, parents, calls, src)
    events = pa.concat_tables([conform(EVENTS, host), *rows.tables()]).unify_dictionaries()
    counters = _memory_counters(memory, clock, origin_unix_ns, device, rank)
    steps = tuple(
        Step(int(k), rank, int(s), int(e - s))
        for k, s, e in sorted(zip(steps_num, steps_start, steps_end, strict=True))
    )
    return Merged(events, counters, steps, clock.total_removed_ns, src.table(), cut0)


def _step_spans(
    host: pa.Table, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, numbers) of the step events, on the mapped clock."""
    is_step = np.array(column_list(host, "kind"), dtype=object) == "step"
    names = np.array(column_list(host, "name"), dtype=object)[is_step]
    steps = column_array(host, "step")[is_step]
    numbers = [_step_number(n, s) for n, s in zip(names, steps, strict=True)]
    return start[is_step], end[is_step], np.array(numbers, dtype=np.int64)


def _new_ids(
    calls: Sequence[Any], work: Iterable[Any], next_id: int
) -> tuple[dict[int, int], dict[int, int], np.ndarray]:
    """Event ids for the runtime's events (from `next_id` on), and the runtime's flow ids
    renumbered: a flow takes the id of its launching call, as Kineto flows take their source
    event's id, so it never collides with the importer's flow ids; and the device work's
    starts (one pass over `work`, whose instruction events may be built as they are read)."""
    ids = {e.id: next_id + i for i, e in enumerate(calls)}
    flows = {e.flow_id: ids[e.id] for e in reversed(calls) if e.flow_id}
    i = len(calls)
    starts: list[int] = []
    unlaunched: dict[int, None] = {}  # flows of work no call launched, in order
    for e in work:
        ids[e.id] = next_id + i
        i += 1
        starts.append(e.device_start_ns)
        if e.flow_id and e.flow_id not in flows:
            unlaunched[e.flow_id] = None
    spare = next_id + len(ids)
    for flow in unlaunched:
        flows[flow], spare = spare, spare + 1
    return ids, flows, np.array(starts, dtype=np.int64)


def _step_number(name: str, step: Any) -> int:
    if step is not None and step == step and int(step) >= 0:
        return int(step)
    tail = str(name).rsplit("#", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _fill_op_lines(
    host: pa.Table, parents: np.ndarray, calls: Sequence[Any], src: Attributor
) -> pa.Table:
    """Give each framework op (and its enclosing ops) the user line of the runtime calls it
    made, where the trace itself has none (no with_stack), and the innermost op its module and
    model line; an op recorded without shapes takes those of its own launch."""
    if not host.num_rows or not len(calls):
        return host
    cols = ("src_file", "src_line", "src_func", "shapes", "dtypes")
    files, lines, funcs, shapes, dtypes = (column_list(host, c) for c in cols)
    host = _fill_op_modules(host, parents, calls, src)
    kinds, names = column_list(host, "kind"), column_list(host, "name")
    id_index = {int(v): i for i, v in enumerate(column_array(host, "id"))}
    host_parent = column_array(host, "parent_id")
    for i, e in enumerate(calls):
        p = int(parents[i])
        if 0 <= p < host.num_rows and names[p] == e.op_name and shapes[p] is None and e.shapes:
            shapes[p], dtypes[p] = json_text(e.shapes), json_text(e.dtypes)
        line = src.of(e).src
        while line and 0 <= p < host.num_rows and kinds[p] in FRAMEWORK_KINDS:
            if files[p] is None:
                files[p], lines[p], funcs[p] = line
            parent = host_parent[p]
            p = id_index.get(int(parent), -1) if parent == parent and parent is not None else -1
    for name, values in zip(cols, (files, lines, funcs, shapes, dtypes), strict=True):
        idx = host.schema.get_field_index(name)
        host = host.set_column(
            idx, name, pa.array(values, type=pa.string() if name != "src_line" else pa.int32())
        )
    return host


def _fill_op_modules(
    host: pa.Table, parents: np.ndarray, calls: Sequence[Any], src: Attributor
) -> pa.Table:
    """The framework op that made a runtime call takes the call's module and model line."""
    cols = ("module", "model_file", "model_line", "model_func")
    values = [column_list(host, c) for c in cols]
    for i, e in enumerate(calls):
        p = int(parents[i])
        if 0 <= p < host.num_rows and values[0][p] is None:
            at = src.of(e)
            values[0][p] = at.module
            values[1][p], values[2][p], values[3][p] = at.model or (None, None, None)
    for name, vals in zip(cols, values, strict=True):
        idx = host.schema.get_field_index(name)
        host = host.set_column(
            idx, name, pa.array(vals, type=pa.int32() if name == "model_line" else pa.string())
        )
    return host


def _memory_counters(
    memory: Sequence[Any], clock: HostClock, origin_unix_ns: int, device: str, rank: int
) -> pa.Table:
    """The device's memory_allocated samples, placed by the same clock map as the host spans:
    a sample taken inside a runtime call (the payload op allocating its output) lands inside
    that call's modeled span, hence inside the op that made it, never after it."""
    real = np.array([e.host_start_ns - origin_unix_ns for e in memory], dtype=np.int64)
    ts = clock.map(real)
    return conform(
        COUNTERS,
        {
            "rank": [rank] * len(memory),
            "track": [device] * len(memory),
            "name": ["memory_allocated"] * len(memory),
            "ts_ns": ts.tolist(),
            "value": [float(e.value) for e in memory],
            "unit": ["bytes"] * len(memory),
        },
    )

"""The events the runtime records while a torch.profiler session records (docs/device.md).

Recording appends raw records, cheap: a tuple (a list for a launch, which the device timeline
completes later) whose first item is its layout, one of the NamedTuples below, and whose other
items are that layout's fields in order. The layouts are declared once, here; `drain()` reads
each record by name and turns it into `RuntimeEvent`s, each kernel's instructions and DMA
transfers (up to `instruction_limit()` per drain) as rows of its plan built when read
(drained.py). (Building the NamedTuple itself in the hot
path would cost 2-4x the literal: measured 225-300 ns against 90 ns for a launch.)
"""

from __future__ import annotations

import itertools
import os
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, NamedTuple

from neuron_explorer.backend.runtime import model, source
from neuron_explorer.backend.runtime.drained import Drained, InstrRows
from neuron_explorer.vocab.engines import KERNEL_TRACK
from neuron_explorer.vocab.kinds import RUNTIME_HOST_KINDS as HOST_KINDS

DEFAULT_INSTRUCTION_LIMIT = 200_000
# the limit for this process (`set_instruction_limit` changes it): instruction and DMA events
# are drained as rows (drained.py), but written they are still most of a profiled step's
# memory (130 MiB of a Llama-3-8B rank's peak at the default), so a job of many real ranks on
# one machine lowers it (docs/device.md)
INSTRUCTION_LIMIT_ENV = "NEURON_EXPLORER_INSTRUCTION_LIMIT"


def _limit_from_env() -> int:
    raw = os.environ.get(INSTRUCTION_LIMIT_ENV, "")
    if not raw:
        return DEFAULT_INSTRUCTION_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        limit = -1
    if limit < 0:
        raise ValueError(f"{INSTRUCTION_LIMIT_ENV}={raw!r}: expected a number of events >= 0")
    return limit


@dataclass(frozen=True)
class RuntimeEvent:
    """One thing the neuron runtime did: a host-side call or modeled device work.

    Host events carry real `host_start_ns`/`host_end_ns` (time.time_ns clock) and the modeled
    `host_cost_ns`; device events carry `device_start_ns`/`device_dur_ns` on the modeled clock.
    """

    id: int
    kind: str  # one of vocab.kinds.RUNTIME_KINDS (the clock markers included)
    name: str
    op_name: str = ""  # the aten op (or FX graph) whose call caused this event
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    tid: int = 0  # native thread id of the calling host thread
    host_start_ns: int | None = None
    host_end_ns: int | None = None
    host_cost_ns: int = 0  # modeled duration of this call on the real chip
    cut_before_ns: int = 0  # real minus modeled backend time summed before this call
    device_start_ns: int | None = None  # modeled clock: real time.time_ns minus the cut
    device_dur_ns: int | None = None
    track: str = ""  # device events: "kernels", an engine ("TensorE", ...) or "DMA q<N>"
    engine: str = ""
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    flow_id: int = 0  # same id on a launching host call and the device work it caused
    parent_id: int | None = None  # instructions and DMAs -> their kernel
    src_file: str | None = None  # innermost user frame of the launching call
    src_line: int | None = None
    src_func: str | None = None
    stack: tuple = ()  # the whole stack, innermost first: (file, line, function, scope) frames
    module: str | None = None  # nn.Module path of the innermost running module ("" the model)
    seq_nr: int = -1  # autograd sequence number of the op's node (backward: the node run)
    is_backward: bool = False
    value: int = 0  # memory events: bytes allocated after the change
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def layer(self) -> str:
        return "host" if self.kind in HOST_KINDS else "device"


class HostRecord(NamedTuple):
    """A host call: compile, runtime (a launch), fallback, sync, copy; "gc" and "cut" spans are
    simulator time for the clock only."""

    id: int
    kind: str
    name: str
    op: str  # the aten op (or FX graph) whose call made it
    shapes: tuple
    dtypes: tuple
    tid: int
    t0: int  # the real span, time.time_ns
    t1: int
    cost: int  # modeled host cost
    cut: int  # the running cut before the call
    site: tuple | None  # (stack id, module path) of the call site
    seq: int  # autograd sequence number, -1 for none
    bwd: bool
    flow: int
    args: dict | None


class LaunchRecord(NamedTuple):
    """An eager kernel launch: the kernel and its launching call in one record (the hot path
    appends one per op; drain makes the two events). Recorded as a list that is also its
    entry in model._pending: the device timeline fills `placed` (its last item)."""

    kernel_id: int
    host_id: int
    op: str
    entry: tuple  # (plan, shapes, dtypes): the compile cache's entry
    tid: int
    t0: int
    t1: int
    cut: int
    site: tuple | None
    seq: int
    bwd: bool
    flow: int
    cost: int  # modeled launch cost
    plan: Any
    ready: int  # device-relative ns the kernel may start
    placed: Any  # DeviceTimeline.place's result, None until model.schedule_pending


class KernelRecord(NamedTuple):
    """A kernel submitted on its own (a compiled graph's kernels, after their launch)."""

    id: int
    name: str
    op: str
    shapes: tuple
    dtypes: tuple
    tid: int
    plan: Any
    cell: list  # [plan, ready_ns, placed] in model._pending; the timeline fills `placed`
    flow: int
    site: tuple | None
    seq: int
    bwd: bool
    args: dict | None
    # a NEFF's group: where each of its instructions is in the NEFF plan that `cell` places
    # (the whole compiled graph is one unit on the timeline); None for a kernel on its own
    neff_index: tuple | None


class ForwardRecord(NamedTuple):
    """A metadata op (view, reshape...) that launched no kernel but made autograd node `seq` at
    its user line, for the backward kernels to inherit."""

    id: int
    tid: int
    t_ns: int
    cut: int
    seq: int
    site: tuple


class MemoryRecord(NamedTuple):
    """A change of the device's allocated bytes."""

    id: int
    tid: int
    t_ns: int
    cut: int
    allocated: int
    delta: int
    peak: int


_ids = itertools.count(1)
_flows = itertools.count(1)
_buf: list[Any] = []  # raw records: (layout, *fields), and ("event", RuntimeEvent)
_lock = threading.Lock()
_instruction_limit = _limit_from_env()
# Events drained and handed back (`keep`): the Kineto plugin drains at the profiler's stop,
# before on_trace_ready runs trace_handler, which drains them again
_kept: list[Any] = []  # events, and kernels' InstrRows (drained.py)


_thread = threading.local()


def native_tid() -> int:
    """The calling thread's native id, as torch.profiler's traces name threads; kept per thread
    (threading.get_native_id is a system call each time)."""
    try:
        return _thread.tid
    except AttributeError:
        _thread.tid = threading.get_native_id()
        return _thread.tid


def next_id() -> int:
    return next(_ids)


def next_flow() -> int:
    return next(_flows)


def set_instruction_limit(limit: int) -> None:
    """Cap instruction and DMA events per drain (0 keeps kernel-level events only)."""
    global _instruction_limit
    _instruction_limit = max(0, int(limit))


def instruction_limit() -> int:
    return _instruction_limit


def append(raw: tuple) -> None:
    """Append one raw record, (layout, *fields), or ("event", a whole RuntimeEvent)."""
    _buf.append(raw)


_new = tuple.__new__  # a layout's record from its fields: cheaper than Layout._make


def record_host(kind: str, name: str, op: str, shapes: tuple, dtypes: tuple, tid: int, t0: int,
                t1: int, cost: int, site: tuple | None, seq: int, bwd: bool, flow: int = 0,
                args: dict | None = None) -> int:  # fmt: skip
    """Record one host call and advance the one clock by its cut; returns its event id."""
    eid = next(_ids)
    cut = model.cut_ns  # model.add_cut(t1 - t0, cost) without a call: every metadata op's path
    model.cut_ns = cut + (t1 - t0) - cost
    if t1 > model.last_end_ns:  # a hand-off window is recorded after later calls
        model.last_end_ns = t1
    _buf.append(
        (HostRecord, eid, kind, name, op, shapes, dtypes, tid, t0, t1, cost, cut, site, seq, bwd,
         flow, args)
    )  # fmt: skip
    return eid


ON_DRAIN: list = []  # called by drain() and clear(): the capture is over (hostcost.pause)


def pending() -> int:
    """Raw records waiting to be drained (kernels count once)."""
    return len(_buf)


def clear() -> None:
    """Drop everything recorded so far."""
    for hook in ON_DRAIN:  # as drain() does
        hook()
    with _lock:
        _buf.clear()
        _kept.clear()


def keep(drained: Sequence[RuntimeEvent]) -> None:
    """Hand drained events back: the next drain() returns them first, in their order."""
    with _lock:
        _kept[:0] = drained.items if isinstance(drained, Drained) else drained


def drain() -> Drained:
    """Return the events recorded since the last drain, oldest first, and forget them (each
    kernel's instruction and DMA events as rows, built when read: drained.py)."""
    for hook in ON_DRAIN:  # hostcost.pause: the round trip's record callback goes off
        hook()
    with _lock:
        model.schedule_pending()
        raw = _buf[:]
        del _buf[: len(raw)]
        out: list[Any] = _kept[:]  # events, and kernels' InstrRows
        _kept.clear()
    budget = _instruction_limit
    for rec in raw:
        layout = rec[0]
        if layout is LaunchRecord:
            if rec[-1] is None:  # launched on another thread while this drain began
                model.schedule_pending()
            budget = _launch_events(_new(LaunchRecord, rec[1:]), out, budget)
        elif layout is HostRecord:
            out.append(_host_event(_new(HostRecord, rec[1:])))
        elif layout is KernelRecord:
            budget = _kernel_events(_new(KernelRecord, rec[1:]), out, budget)
        elif layout is MemoryRecord:
            out.append(_memory_event(_new(MemoryRecord, rec[1:])))
        elif layout is ForwardRecord:
            out.append(_forward_event(_new(ForwardRecord, rec[1:])))
        elif layout == "event":  # made whole at record time (a collective)
            out.append(rec[1])
    return Drained(out)


def where(site: tuple | None) -> tuple:
    """(file, line, function, stack, module) of a recorded call site (stack id, module path):
    the innermost user frame and the whole stack come from the interned stack."""
    if site is None:
        return None, None, None, (), None
    if len(site) == 3:  # a bare (file, line, function)
        return (*site, (), None)
    sid, module = site
    if sid < 0:
        return None, None, None, (), module
    file, line, func = source.USER_FRAME[sid] or (None, None, None)
    return file, line, func, source.STACKS[sid], module


def _host_event(r: HostRecord) -> RuntimeEvent:
    file, line, func, stack, module = where(r.site)
    return RuntimeEvent(
        id=r.id, kind=r.kind, name=r.name, op_name=r.op, shapes=r.shapes, dtypes=r.dtypes,
        tid=r.tid, host_start_ns=r.t0, host_end_ns=r.t1, host_cost_ns=r.cost,
        cut_before_ns=r.cut, flow_id=r.flow, src_file=file, src_line=line, src_func=func,
        stack=stack, module=module, seq_nr=r.seq, is_backward=r.bwd, args=r.args or {},
    )  # fmt: skip


def _forward_event(r: ForwardRecord) -> RuntimeEvent:
    file, line, func, stack, module = where(r.site)
    return RuntimeEvent(
        id=r.id, kind="forward", name="forward", tid=r.tid, host_start_ns=r.t_ns,
        host_end_ns=r.t_ns, cut_before_ns=r.cut, src_file=file, src_line=line, src_func=func,
        stack=stack, module=module, seq_nr=r.seq,
    )  # fmt: skip


def _memory_event(r: MemoryRecord) -> RuntimeEvent:
    return RuntimeEvent(
        id=r.id, kind="memory", name="memory_allocated", tid=r.tid, host_start_ns=r.t_ns,
        host_end_ns=r.t_ns, cut_before_ns=r.cut, value=r.allocated,
        args={"delta_bytes": r.delta, "peak_bytes": r.peak},
    )  # fmt: skip


def _launch_events(r: LaunchRecord, out: list[Any], budget: int) -> int:
    """An eager kernel launch: the kernel (with its instructions), then its launching call."""
    plan, shapes, dtypes = r.entry
    kernel = KernelRecord(r.kernel_id, plan.name, r.op, shapes, dtypes, r.tid, plan,
                          [plan, r.ready, r.placed], r.flow, r.site, r.seq, r.bwd, None, None)  # fmt: skip
    budget = _kernel_events(kernel, out, budget)
    launch = HostRecord(r.host_id, "runtime", "launch", r.op, shapes, dtypes, r.tid, r.t0, r.t1,
                        r.cost, r.cut, r.site, r.seq, r.bwd, r.flow, None)  # fmt: skip
    out.append(_host_event(launch))
    return budget


def _kernel_events(k: KernelRecord, out: list[Any], budget: int) -> int:
    from neuron_explorer.backend.costmodel.graph_neff import group_span
    from neuron_explorer.backend.costmodel.timeline import KernelRun

    eid, op, tid, plan, flow, seq, bwd = k.id, k.op, k.tid, k.plan, k.flow, k.seq, k.bwd
    if k.cell[-1] is None:  # launched on another thread while this drain began
        model.schedule_pending()
    if k.neff_index is None:
        run = KernelRun(plan, *k.cell[-1])
    else:  # a slice of its NEFF's placement
        _first, _last, offsets, rot, nq, shift = k.cell[-1]
        mine = tuple([offsets[n] for n in k.neff_index])
        start, end = group_span(plan, k.neff_index, offsets)  # as whatif --chip reads it
        run = KernelRun(plan, shift + start, shift + end, mine, rot, nq, shift)
    file, line, func, stack, module = where(k.site)
    base = model.origin_ns
    out.append(
        RuntimeEvent(
            id=eid, kind="kernel", name=k.name, op_name=op, shapes=k.shapes, dtypes=k.dtypes, tid=tid,
            device_start_ns=base + int(run.start_ns), device_dur_ns=int(run.end_ns - run.start_ns),
            track=KERNEL_TRACK, flops=int(plan.flops), bytes_read=int(plan.bytes_read),
            bytes_written=int(plan.bytes_written), flow_id=flow, src_file=file, src_line=line,
            src_func=func, stack=stack, module=module, seq_nr=seq, is_backward=bwd,
            args={"category": plan.category, **(k.args or {})},
        )
    )  # fmt: skip
    if budget <= 0 or not plan.instrs:
        return budget
    n = min(budget, len(plan.instrs))
    # its instruction and DMA events as rows of the plan, built when read (drained.py); their
    # ids are taken now, in the order the events were made one by one
    out.append(InstrRows(out[-1], plan, run, base, array("q", islice(_ids, n))))
    return budget - n

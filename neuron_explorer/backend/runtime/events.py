"""The events the runtime records while a torch.profiler session records (docs/device.md).

Recording appends raw tuples (cheap); `drain()` turns them into `RuntimeEvent`s, expanding each
kernel's instructions and DMA transfers up to `instruction_limit()` per drain.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from neuron_explorer.backend.runtime import model, source
from neuron_explorer.vocab.engines import KERNEL_TRACK
from neuron_explorer.vocab.kinds import RUNTIME_HOST_KINDS as HOST_KINDS

DEFAULT_INSTRUCTION_LIMIT = 200_000


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


_ids = itertools.count(1)
_flows = itertools.count(1)
_buf: list[Any] = []  # record tuples, and launch lists (placed later: rec[-1] is set)
_lock = threading.Lock()
_instruction_limit = DEFAULT_INSTRUCTION_LIMIT


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
    _buf.append(raw)


def pending() -> int:
    """Raw records waiting to be drained (kernels count once)."""
    return len(_buf)


def clear() -> None:
    """Drop everything recorded so far."""
    with _lock:
        _buf.clear()


def drain() -> list[RuntimeEvent]:
    """Return the events recorded since the last drain, oldest first, and forget them."""
    with _lock:
        model.schedule_pending()
        raw = _buf[:]
        del _buf[: len(raw)]
    out: list[RuntimeEvent] = []
    budget = _instruction_limit
    for rec in raw:
        tag = rec[0]
        if tag == "host":
            out.append(_host_event(rec))
        elif tag == "launch":
            budget = _launch_events(rec, out, budget)
        elif tag == "kernel":
            budget = _kernel_events(rec, out, budget)
        elif tag == "event":  # made whole at record time (a collective)
            out.append(rec[1])
        elif tag == "forward":
            _, eid, tid, t_ns, cut, seq, site = rec
            file, line, func, stack, module = where(site)
            out.append(
                RuntimeEvent(
                    id=eid, kind="forward", name="forward", tid=tid, host_start_ns=t_ns,
                    host_end_ns=t_ns, cut_before_ns=cut, src_file=file, src_line=line,
                    src_func=func, stack=stack, module=module, seq_nr=seq,
                )
            )  # fmt: skip
        elif tag == "memory":
            _, eid, tid, t_ns, cut, allocated, delta, peak = rec
            out.append(
                RuntimeEvent(
                    id=eid, kind="memory", name="memory_allocated", tid=tid, host_start_ns=t_ns,
                    host_end_ns=t_ns, cut_before_ns=cut, value=allocated,
                    args={"delta_bytes": delta, "peak_bytes": peak},
                )
            )  # fmt: skip
    return out


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


def _host_event(rec: tuple) -> RuntimeEvent:
    (_, eid, kind, name, op, shapes, dtypes, tid, t0, t1, cost, cut, src, seq, bwd, flow, args) = (
        rec
    )
    file, line, func, stack, module = where(src)
    return RuntimeEvent(
        id=eid, kind=kind, name=name, op_name=op, shapes=shapes, dtypes=dtypes, tid=tid,
        host_start_ns=t0, host_end_ns=t1, host_cost_ns=cost, cut_before_ns=cut, flow_id=flow,
        src_file=file, src_line=line, src_func=func, stack=stack, module=module, seq_nr=seq,
        is_backward=bwd, args=args or {},
    )  # fmt: skip


def _launch_events(rec: list, out: list[RuntimeEvent], budget: int) -> int:
    """An eager kernel launch: the kernel (with its instructions), then its launching call."""
    (_, kid, hid, op, entry, tid, t0, t1, cut, src, seq, bwd, flow, cost, plan, _ready,
     _placed) = rec  # fmt: skip
    _plan, shapes, dtypes = entry
    budget = _kernel_events(
        ("kernel", kid, plan.name, op, shapes, dtypes, tid, plan, rec, flow, src, seq, bwd, None),
        out,
        budget,
    )
    out.append(
        _host_event(
            (
                "host",
                hid,
                "runtime",
                "launch",
                op,
                shapes,
                dtypes,
                tid,
                t0,
                t1,
                cost,
                cut,
                src,
                seq,
                bwd,
                flow,
                None,
            )
        )  # fmt: skip
    )
    return budget


def _kernel_events(rec: tuple, out: list[RuntimeEvent], budget: int) -> int:
    (_, eid, name, op, shapes, dtypes, tid, plan, cell, flow, src, seq, bwd, args) = rec
    from neuron_explorer.backend.costmodel.timeline import KernelRun

    if cell[-1] is None:  # launched on another thread while this drain began
        model.schedule_pending()
    run = KernelRun(plan, *cell[-1])
    file, line, func, stack, module = where(src)
    base = model.origin_ns
    out.append(
        RuntimeEvent(
            id=eid, kind="kernel", name=name, op_name=op, shapes=shapes, dtypes=dtypes, tid=tid,
            device_start_ns=base + int(run.start_ns), device_dur_ns=int(run.end_ns - run.start_ns),
            track=KERNEL_TRACK, flops=int(plan.flops), bytes_read=int(plan.bytes_read),
            bytes_written=int(plan.bytes_written), flow_id=flow, src_file=file, src_line=line,
            src_func=func, stack=stack, module=module, seq_nr=seq, is_backward=bwd,
            args={"category": plan.category, **(args or {})},
        )
    )  # fmt: skip
    for r in run.instrs:
        if budget <= 0:
            break
        budget -= 1
        out.append(
            RuntimeEvent(
                id=next_id(), kind="dma" if r.track.startswith("DMA") else "instruction",
                name=r.opcode, op_name=op, tid=tid, device_start_ns=base + int(r.start_ns),
                device_dur_ns=int(r.dur_ns), track=r.track, engine=r.engine, flops=int(r.flops),
                bytes_read=int(r.bytes_read), bytes_written=int(r.bytes_written), flow_id=flow,
                parent_id=eid, src_file=file, src_line=line, src_func=func, stack=stack, module=module,
                seq_nr=seq, is_backward=bwd, args={"count": r.count, "utilization": r.utilization},
            )
        )  # fmt: skip
    return budget

"""torch.distributed collectives on neuron tensors: host data movement, modeled device cost.

`c10d::*` and `_c10d_functional::*` ops reach `__torch_dispatch__` like any other op. They run on
the neuron tensors' CPU payloads themselves (no copies: an async op's library thread writes into
the very buffers the wrappers hold), through the process group's host library (gloo), so the
numbers equal a gloo run. While a profiler records, each collective is one host call and one
device event on the `CC` track (the collective-communication cores). Its time splits into
**wait** (until the last rank of the group arrived, on the one modeled clock: the ranks swap
their arrival times through the group's store) and **transfer** (costmodel/collectives.py).
The device event starts when the last rank arrived and lasts the transfer, so the same
collective ends at one modeled instant on every rank. A collective the program waits for at once
(`dist.all_reduce(t)`, a barrier, a receive) is a host call lasting wait + transfer; one it does
not wait for (`async_op=True`, DDP's gradient buckets, a send) costs the host a launch, and the
CC queue runs it while the host launches more compute:
the overlap of communication with compute. So does one issued on a side stream (FSDP2's
all-gathers and reduce-scatters, `async_op=False`): a side stream maps to the CC queue
(backend/streams.py, runtime/queues.py), the collective starts after the work that stream
waits for, and the compute queue waits for it only where the program waits for the stream's
event (`wait_event`, `wait_stream`) or touches its buffers. Collectives follow one another on
the CC queue, and a device sync waits for them too (model.collectives_free_ns). A
point-to-point receive waits for its sender's arrival only (the pair's store key), not for the
whole group.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend import model_ranks
from neuron_explorer.backend.costmodel import collectives as cc
from neuron_explorer.backend.runtime import arrivals, events, hostcost, model, queues
from neuron_explorer.backend.runtime.source import call_site
from neuron_explorer.backend.runtime.work_tls import without_python_tls
from neuron_explorer.vocab.engines import COLLECTIVE_TRACK as CC_LANE

_now = time.time_ns

# op name -> the collective it is, as the cost model sees it (None: no data moves)
KIND_OF: dict[str, str | None] = {
    **dict.fromkeys(("c10d::allreduce_", "c10d::allreduce_coalesced_",
                     "_c10d_functional::all_reduce", "_c10d_functional::all_reduce_",
                     "_c10d_functional::all_reduce_coalesced",
                     "_c10d_functional::all_reduce_coalesced_"), cc.ALL_REDUCE),
    **dict.fromkeys(("c10d::allgather_", "c10d::_allgather_base_", "c10d::allgather_coalesced_",
                     "c10d::allgather_into_tensor_coalesced_", "c10d::gather_",
                     "_c10d_functional::all_gather_into_tensor",
                     "_c10d_functional::all_gather_into_tensor_out",
                     "_c10d_functional::all_gather_into_tensor_coalesced"), cc.ALL_GATHER),
    **dict.fromkeys(("c10d::reduce_scatter_", "c10d::_reduce_scatter_base_",
                     "c10d::reduce_scatter_tensor_coalesced_", "c10d::scatter_",
                     "_c10d_functional::reduce_scatter_tensor",
                     "_c10d_functional::reduce_scatter_tensor_out",
                     "_c10d_functional::reduce_scatter_tensor_coalesced"), cc.REDUCE_SCATTER),
    **dict.fromkeys(("c10d::broadcast_", "_c10d_functional::broadcast",
                     "_c10d_functional::broadcast_"), cc.BROADCAST),
    "c10d::reduce_": cc.REDUCE,
    **dict.fromkeys(("c10d::alltoall_", "c10d::alltoall_base_",
                     "_c10d_functional::all_to_all_single"), cc.ALL_TO_ALL),
    **dict.fromkeys(("c10d::send", "c10d::recv_", "c10d::recv_any_source_",
                     "_c10d_functional::isend", "_c10d_functional::irecv",
                     "_c10d_functional::batch_p2p_ops"), cc.P2P),
    **dict.fromkeys(("c10d::barrier", "c10d::monitored_barrier_"), cc.BARRIER),
    **dict.fromkeys(("_c10d_functional::wait_tensor",
                     "_c10d_functional::_wrap_tensor_autograd"), None),
}  # fmt: skip
# the argument of a c10d op that holds this rank's input (a functional op's is its first)
_SEND_ARG = {cc.ALL_GATHER: 1, cc.REDUCE_SCATTER: 1}
_WRAP = "_c10d_functional::_wrap_tensor_autograd"
stores, group_store = arrivals.stores, arrivals.group_store  # backend/distributed.py fills stores


def is_collective(name: str) -> bool:
    return name in KIND_OF


def run(info: Any, args: tuple, kwargs: dict) -> Any:
    """Run a c10d op on the payloads of its neuron tensors; record it while profiling."""
    from neuron_explorer.backend.tensor import NeuronTensor, new_tensor

    wrappers: dict[int, NeuronTensor] = {}

    def unwrap(a: Any) -> Any:
        if isinstance(a, NeuronTensor):
            wrappers[id(a._payload)] = a
            return a._payload
        if type(a) in (list, tuple):
            return type(a)(unwrap(x) for x in a)
        return a

    def rewrap(o: Any) -> Any:
        if isinstance(o, torch.Tensor) and not isinstance(o, NeuronTensor):
            w = wrappers.get(id(o))
            return w if w is not None else new_tensor(info.name, o)
        if type(o) in (list, tuple):
            return model_ranks.completed(type(o)(rewrap(x) for x in o))
        return o

    host_args = unwrap(args)
    host_kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    info = _HostCall(info.name, without_python_tls(info.call))  # its Work: no Python object
    kind = KIND_OF[info.name]
    if info.name == _WRAP:
        # the functional collectives' AsyncCollectiveTensor would become the payload, a
        # storage-less wrapper that the CPU kernels cannot read (a segfault on first use): the
        # collective's data is already in place (its host work was waited for), so its wait is
        # taken now and the neuron tensor itself comes back; the device still orders its
        # readers after the collective (_hold)
        return rewrap(torch.ops._c10d_functional.wait_tensor.default(host_args[0]))
    if kind is None or _tracing(host_args):  # torch.compile traces it: nothing runs yet
        return rewrap(info.call(*host_args, **host_kwargs))
    if not _prof._is_profiler_enabled:
        # still numbered and announced: a rank that profiles (perhaps only rank 0) reads every
        # rank's arrival at each collective, so every rank must publish its own
        arrived = model.origin_ns + model.modeled_now(_now())
        group = _group_of(args)
        if kind == cc.P2P:
            arrivals.p2p_arrival(info.name, group, args, arrived)
        out = info.call(*host_args, **host_kwargs)
        if kind != cc.P2P:
            arrivals.announce(group, arrivals.number(group), arrived)
        return rewrap(out)
    return rewrap(_run_recorded(info, kind, args, host_args, host_kwargs))


def _tracing(host_args: Any) -> bool:
    """The payloads are fake tensors: torch.compile traces the collective (into a graph whose
    NEFF runs it, backend/graph_lowering.py), so it is neither numbered nor recorded here."""
    first = host_args[0] if host_args else None
    if type(first) in (list, tuple):
        first = first[0] if first else None
    return isinstance(first, torch.Tensor) and type(first) is not torch.Tensor


class _HostCall(NamedTuple):  # what `run` reads of an op: its name and how to call it
    name: str
    call: Callable[..., Any]


def barrier(group: Any, call: Callable[[], Any]) -> Any:
    """A barrier of a neuron group on a CPU tensor: `dist.barrier()` gives a gloo group's
    barrier the CPU's tensor, so it never reaches `__torch_dispatch__`; it runs (`call`) and is
    modeled here as one on a neuron tensor is: numbered in its group on every rank, its wait
    for the last rank measured on the one clock, its transfer a tiny all-reduce's."""
    return run(_HostCall("c10d::barrier", lambda *_: call()), (group.group_name,), {})


def _run_recorded(info: Any, kind: str, args: tuple, host_args: Any, host_kwargs: dict) -> Any:
    """Run one collective while profiling and record its host call and its device event."""
    # its record's round trip and the previous op's return are cut as a copy's (record.py), and
    # its record is watched: the stretches on both sides are cut as between two ops (issue 27)
    o, t0 = hostcost.round_trip(_now())
    model.cut_ns += o  # add_cut(o, 0): the previous op's return, before the span
    src = call_site(4)  # (stack id, module path): the whole stack, as for kernels
    group = _group_of(args)
    # absolute modeled times (real minus this process's cut): comparable between the ranks;
    # the collective queue (CC) is part of the device, so one collective follows the last; on
    # the default stream it follows the compute launched before it, on a side stream the work
    # that stream waits for
    side = queues.side
    after = model.device_idle_at() if side is None else max(side.tail_ns, model.collectives_free_ns)
    arrival = model.origin_ns + max(model.modeled_now(t0), after)
    name = group.group_name if group is not None else ""
    if kind == cc.P2P:
        blocking = info.name in _RECV  # a receiver needs the data; a sender goes on
        sender = arrivals.p2p_arrival(info.name, group, args, arrival)
        out = info.call(*host_args, **host_kwargs)
        last, where = max(arrival, sender), {"group": name, "peer": arrivals.peer(args)}
    else:
        blocking = side is None and (kind == cc.BARRIER or _called_synchronously())
        out = info.call(*host_args, **host_kwargs)
        if kind != cc.BARRIER:
            _wait_for_work(out)
        seq = arrivals.number(group)
        last = arrivals.last_arrival(group, arrival, seq)
        where = {"group": name, "seq": seq}  # names this collective on every rank of the group
    size = group.size() if group is not None else 1
    nbytes = priced_bytes(info.name, kind, host_args, size)
    cost = cc.collective_cost(kind, nbytes, 2 if kind == cc.P2P else size, model.spec().collectives)
    drain = arrival - model.origin_ns - model.modeled_now(t0)  # the buffers' kernels first
    wait = max(0, last - arrival)
    model.collectives_free_ns = end = last - model.origin_ns + cost.transfer_ns
    functional = info.name.startswith("_c10d_functional")
    if side is not None:  # the stream's later work, and whoever waits on it, follow it
        side.tail_ns = end
        _hold(host_args, end)
        if functional:  # its result is a new tensor (a c10d op's are its arguments)
            _hold(out, end)
    elif not blocking:
        _hold(host_args, end)
        if functional:
            _hold(out, end)
        _note_async(out, end)
    elif kind == cc.P2P:
        # the caller waits on the receive's Work (waiting twice on a gloo receive hangs): that
        # real wait is cut, the modeled one is already in this call
        _note_work(out, end)
    host = drain + wait + cost.transfer_ns if blocking else model.spec().runtime.launch_ns
    where["overlapped"] = not blocking
    if side is not None:
        where["stream"] = "side"
    _record(info.name, kind, t0, _now(), host, wait, cost, nbytes, size, src, last, where)
    return out


# storages overlapped collectives still use, and the engines' floor (runtime/queues.py)
pending = queues.pending
_FLOOR = queues.FLOOR


def _hold(a: Any, end: int) -> None:
    if isinstance(a, torch.Tensor):
        ptr = a.untyped_storage().data_ptr()
        if ptr:  # a freed storage (FSDP2 frees unsharded parameters) has none
            pending[ptr] = end
    elif type(a) in (list, tuple):
        for x in a:
            _hold(x, end)


def ready_after(inputs: list, ready: int) -> int:
    """The launch time `ready` of a kernel on `inputs` ((payload, wrapper) pairs), no earlier
    than the end of an overlapped collective on any of their storages, nor than a kernel
    launched before it that waited for one."""
    now = ready
    ready = max(ready, pending.get(_FLOOR, 0))
    for p, _w in inputs:
        end = pending.get(p.untyped_storage().data_ptr())
        if end is not None and end > ready:
            ready = end
    if ready > now and queues.side is None:  # a side stream's kernel holds up no other
        pending[_FLOOR] = ready
    for ptr in [k for k, end in pending.items() if end <= now]:  # later launches are later
        del pending[ptr]
    return ready


_work_end: dict[int, tuple[Any, int]] = {}  # id(Work) -> (the Work, its collective's end)
_task_end: dict[int, int] = {}  # autograd graph task -> end of its last overlapped collective


def _note_async(out: Any, end: int) -> None:
    """Remember when an overlapped collective ends, for the host's wait on it: a Work's
    `wait()`, or the end of the backward pass that issued it (DDP's final callback waits there
    for the all-reduces its hooks issued)."""
    task = torch._C._current_graph_task_id()
    if task != -1:
        if task not in _task_end:
            torch.autograd.Variable._execution_engine.queue_callback(lambda: _backward_done(task))
        _task_end[task] = max(_task_end.get(task, 0), end)
        return
    _note_work(out, end)


def _note_work(out: Any, end: int) -> None:
    for w in out if type(out) in (list, tuple) else (out,):
        if isinstance(w, torch.ScriptObject):
            w = torch._C._distributed_c10d.Work.unbox(w)
        if isinstance(w, torch._C._distributed_c10d.Work):
            _work_end[id(w)] = (w, end)  # held: the same Work object reaches the caller


def _backward_done(task: int) -> None:
    end = _task_end.pop(task, None)
    if end is not None and _prof._is_profiler_enabled:
        _host_wait(end, _now())


def _host_wait(end: int, t0: int) -> None:
    """The host waiting (since real time t0) for an overlapped collective that ends at device
    time `end`: its real span is cut, its modeled cost is what is left of the collective."""
    wait = max(0, end - model.modeled_now(t0))
    events.record_host("runtime", "c10d::wait", "c10d::wait", (), (), events.native_tid(), t0,
                       _now(), wait, None, -1, False, args={"wait_ns": wait})  # fmt: skip


def install_wait() -> None:
    """Route `Work.wait()` through `_host_wait` for the collectives this module overlapped
    (idempotent): the real wait (gloo's, or a send's for its receiver) is simulator time, the
    modeled one lasts until the collective's modeled end."""
    work = torch._C._distributed_c10d.Work
    if getattr(work.wait, "_neuron", False):
        return
    original = work.wait

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        done = original(self, *args, **kwargs)
        entry = _work_end.pop(id(self), None)
        if entry is not None and _prof._is_profiler_enabled:
            _host_wait(entry[1], t0)
        return done

    wait._neuron = True  # type: ignore[attr-defined]
    work.wait = wait  # type: ignore[method-assign]


_RECV = arrivals._RECV
_C10D_FILE = "distributed_c10d.py"


def _called_synchronously() -> bool:
    """Whether the user's torch.distributed call waits for this collective (`async_op=False`,
    the default): the host blocks until it ends. DDP's bucket all-reduces (issued by its C++
    reducer during backward) and `async_op=True` do not block the host: the collective runs on
    the device's CC queue while the host goes on launching compute. (Nor does a call on a side
    stream, whatever its async_op: FSDP2's; `_run_recorded` reads queues.side first.)"""
    f: types.FrameType | None = sys._getframe(3)
    while f is not None:
        if f.f_code.co_filename.endswith(_C10D_FILE) and "async_op" in f.f_locals:
            return not f.f_locals["async_op"]
        f = f.f_back
    return False


def _group_of(args: tuple) -> Any:
    """The torch.distributed ProcessGroup an op runs on (a ScriptObject or a group name)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject):
            return dist.ProcessGroup.unbox(a)
        if isinstance(a, str) and a:
            try:
                return _resolve_process_group(a)  # type: ignore[arg-type]  # a group name
            except (KeyError, ValueError, RuntimeError):
                continue
    return None


def _wait_for_work(out: Any) -> None:
    """Block on the op's Work (the modeled collective runs to completion)."""
    works = out if type(out) in (list, tuple) else (out,)
    for w in works:
        if isinstance(w, torch.ScriptObject):
            w = torch._C._distributed_c10d.Work.unbox(w)
        if isinstance(w, torch._C._distributed_c10d.Work):
            w.wait()


def priced_bytes(op: str, kind: str, host_args: Any, size: int) -> int:
    """The buffer the cost model prices (costmodel/collectives.py): an all-gather's gathered
    output (this rank's shard times the group), a reduce-scatter's unreduced input, else what
    the op sends. Read from the input, which every rank holds (a c10d gather's or scatter's
    other side is empty off the root)."""
    functional = op.startswith("_c10d_functional")
    nbytes = _bytes(host_args[0 if functional else _SEND_ARG.get(kind, 0)])
    return nbytes * size if kind == cc.ALL_GATHER else nbytes


def _bytes(a: Any) -> int:
    if isinstance(a, torch.Tensor):
        return a.numel() * a.element_size()
    if type(a) in (list, tuple):
        return sum(_bytes(x) for x in a)
    return 0


def _record(name, kind, t0, t1, host, wait, cost, nbytes, size, src, start, where) -> None:
    """One host call (`host` ns of modeled cost, the real span cut) and its device event on
    `CC` from `start` (the last rank's arrival) for the modeled transfer."""
    flow = events.next_flow()
    args = {"collective": kind, "bytes": nbytes, "world_size": size, "wait_ns": wait,
            "transfer_ns": cost.transfer_ns, "algorithm": cost.algorithm, "link": cost.link,
            "bus_bytes": cost.bus_bytes, **where}  # fmt: skip
    events.record_host("runtime", name, name, (), (), events.native_tid(), t0, t1,
                       host, src, -1, False, flow=flow, args=args)  # fmt: skip
    file, line, func, stack, module = events.where(src)
    events.append(
        ("event", events.RuntimeEvent(
            id=events.next_id(), kind="collective", name=kind, op_name=name,
            tid=events.native_tid(), device_start_ns=start, device_dur_ns=cost.transfer_ns,
            track=CC_LANE, engine=CC_LANE, bytes_read=nbytes, bytes_written=nbytes, flow_id=flow,
            src_file=file, src_line=line, src_func=func, stack=stack, module=module, args=args,
        ))
    )  # fmt: skip

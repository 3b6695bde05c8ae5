"""torch.distributed collectives on neuron tensors: host data movement, modeled device cost.

`c10d::*` and `_c10d_functional::*` ops reach `__torch_dispatch__` like any other op. They run on
the neuron tensors' CPU payloads themselves (no copies: an async op's library thread writes into
the very buffers the wrappers hold), through the process group's host library (gloo), so the
numbers equal a gloo run. While a profiler records, each collective is one host call and one
device event on the `CC` track (the collective-communication cores). Its time splits into
**wait** (until the last rank of the group arrived, on the one modeled clock: the ranks swap
their arrival times through the group's store) and **transfer** (costmodel/collectives.py).
The host call lasts wait + transfer: the neuron process group runs collectives to completion,
as gloo does, so every rank leaves a collective at the same modeled instant.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.costmodel import collectives as cc
from neuron_explorer.backend.runtime import events, model
from neuron_explorer.backend.runtime.source import call_site

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
# the argument that holds what a collective sends (its size sets the transfer)
_SEND_ARG = {cc.ALL_GATHER: 1, cc.REDUCE_SCATTER: 1}
_seq: dict[str, itertools.count] = {}  # group name -> collectives recorded on it


def is_collective(name: str) -> bool:
    return name in KIND_OF


def run(info: Any, args: tuple, kwargs: dict) -> Any:
    """Run a c10d op on the payloads of its neuron tensors; record it while profiling."""
    from neuron_explorer.backend.runtime.dispatch import new_tensor
    from neuron_explorer.backend.tensor import NeuronTensor

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
            return type(o)(rewrap(x) for x in o)
        return o

    host_args = unwrap(args)
    host_kwargs = {k: unwrap(v) for k, v in kwargs.items()}
    kind = KIND_OF[info.name]
    if kind is None:
        return rewrap(info.call(*host_args, **host_kwargs))
    if not _prof._is_profiler_enabled:
        # still numbered and announced: a rank that profiles (perhaps only rank 0) reads every
        # rank's arrival at each collective, so every rank must publish its own
        arrived = _now()
        out = info.call(*host_args, **host_kwargs)
        group = _group_of(args)
        _announce(group, _number(group), model.origin_ns + model.modeled_now(arrived))
        return rewrap(out)
    t0 = _now()
    src = call_site(3)  # (stack id, module path): the whole stack, as for kernels
    group = _group_of(args)
    # absolute modeled times (real minus this process's cut): comparable between the ranks
    arrival = model.origin_ns + max(model.modeled_now(t0), model.device_idle_at())
    out = info.call(*host_args, **host_kwargs)
    if kind != cc.BARRIER:
        _wait_for_work(out)
    name = group.group_name if group is not None else ""
    seq = _number(group)
    last = _last_arrival(group, arrival, seq)
    nbytes = _bytes(host_args[_SEND_ARG.get(kind, 0)])
    size = group.size() if group is not None else 1
    if kind == cc.ALL_GATHER and info.name.startswith("_c10d_functional"):
        nbytes *= size  # the functional op's argument is this rank's shard
    cost = cc.collective_cost(kind, nbytes, size, model.spec().collectives)
    drain = arrival - model.origin_ns - model.modeled_now(t0)  # the buffers' kernels first
    wait = max(0, last - arrival)
    where = {"group": name, "seq": seq}  # names this collective on every rank of the group
    _record(info.name, kind, t0, _now(), drain, wait, cost, nbytes, size, src, last, where)
    return rewrap(out)


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


def _number(group: Any) -> int:
    """This collective's number in its group: the same on every rank (they issue a group's
    collectives in one order), profiled or not."""
    name = group.group_name if group is not None else ""
    return next(_seq.setdefault(name, itertools.count()))


def _announce(group: Any, seq: int, mine: int) -> Any:
    """Publish this rank's modeled arrival at collective `seq`; the group's store, or None."""
    if group is None or group.size() <= 1:
        return None
    store = group_store(group)
    if store is None:
        return None
    rank = group.rank()
    store.set(f"neuron-clock/{seq}/{rank}", str(mine))
    # every rank leaves collective seq - 1 only once all have entered it, after any profiling
    # rank read all of seq - 2: this rank's key of seq - 2 is no longer needed
    if seq >= 2:
        store.delete_key(f"neuron-clock/{seq - 2}/{rank}")
    return store


def _last_arrival(group: Any, mine: int, seq: int) -> int:
    """The latest modeled arrival of any rank of `group` at its collective number `seq`."""
    store = _announce(group, seq, mine)
    if store is None:
        return mine
    keys = [f"neuron-clock/{seq}/{r}" for r in range(group.size())]
    return max(int(v) for v in store.multi_get(keys))


def group_store(group: Any) -> Any:
    """The store the neuron backend of `group` was created with (None for other backends)."""
    from neuron_explorer.backend import distributed

    return distributed.store_of(group.group_name)


def _bytes(a: Any) -> int:
    if isinstance(a, torch.Tensor):
        return a.numel() * a.element_size()
    if type(a) in (list, tuple):
        return sum(_bytes(x) for x in a)
    return 0


def _record(name, kind, t0, t1, drain, wait, cost, nbytes, size, src, start, where) -> None:
    """One host call (wait + transfer, the real span cut) and its device event on `CC`."""
    from neuron_explorer.backend.runtime import record

    flow = events.next_flow()
    args = {"collective": kind, "bytes": nbytes, "world_size": size, "wait_ns": wait,
            "transfer_ns": cost.transfer_ns, "algorithm": cost.algorithm, "link": cost.link,
            "bus_bytes": cost.bus_bytes, **where}  # fmt: skip
    record._host("runtime", name, name, (), (), events.native_tid(), t0, t1,
                 drain + wait + cost.transfer_ns, src, -1, False, flow=flow, args=args)  # fmt: skip
    file, line, func, stack, module = events.where(src)
    events.append(
        ("event", events.RuntimeEvent(
            id=events.next_id(), kind="collective", name=kind, op_name=name,
            tid=events.native_tid(), device_start_ns=start, device_dur_ns=cost.transfer_ns,
            track="CC", engine="CC", bytes_read=nbytes, bytes_written=nbytes, flow_id=flow,
            src_file=file, src_line=line, src_func=func, stack=stack, module=module, args=args,
        ))
    )  # fmt: skip

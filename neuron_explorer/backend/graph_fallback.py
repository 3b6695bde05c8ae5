"""Ops of a compiled graph that the device cannot lower: refused by default, or run on the host.

A graph op with no device kernel (`torch.fft.fft`, a `torch.library` custom op without a
registered kernel) fails compilation, as neuronx-cc fails on an op it cannot lower, with the op
and the user's line. With `torch.compile(backend="neuron", options={"fallback": True})` or
`NEURON_COMPILE_FALLBACK=1` the graph is split around such ops instead: each run of device ops
is its own NEFF, and each host op is a recorded CPU fallback (sync, copy out, CPU compute, copy
back), as eager runs it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import fxstack, model, ops, tracking
from neuron_explorer.backend.runtime import record as _rec
from neuron_explorer.backend.runtime.unsupported import NeuronUnsupportedError

ENV = "NEURON_COMPILE_FALLBACK"


def wants_fallback(options: dict | None) -> bool:
    """The opt-in: options={"fallback": True}, else the environment variable."""
    if options and "fallback" in options:
        return bool(options["fallback"])
    return os.environ.get(ENV, "") not in ("", "0", "false", "False")


# functional forms that only traced graphs hold, of what eager runs on the device: a copy
# into a view (x[:, :3] = y), random factories (eager: empty, then normal_ or uniform_)
_GRAPH_FORMS = frozenset({
    "aten::slice_scatter", "aten::select_scatter", "aten::diagonal_scatter",
    "aten::as_strided_scatter", "aten::_unsafe_index_put", "aten::rand", "aten::randn",
    "aten::randint", "aten::rand_like", "aten::randn_like", "aten::randint_like",
    "aten::normal_functional",
})  # fmt: skip


def _lowerable(target: torch._ops.OpOverload) -> bool:
    from neuron_explorer.backend.runtime.collectives import KIND_OF  # torch.distributed: late

    name = target._schema.name
    if ops.is_supported(target) or name in _GRAPH_FORMS or name in KIND_OF:
        return True  # a collective runs in the NEFF, on the collective cores
    if name.endswith("_copy") and name.startswith("aten::"):  # view_copy: a view, copied
        packet = getattr(torch.ops.aten, name[6:-5], None)
        if packet is not None and packet.default.is_view:
            return True
    # functionalization turns the eager in-place op into its out-of-place twin (fill_ into
    # fill): either name in the device's table lowers
    twin = name[:-1] if name.endswith("_") else name + "_"
    return twin in ops.ENGINE_OF


def host_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The graph's aten ops the device has no kernel for (size queries and asserts aside)."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        val = node.meta.get("val")
        values = val if isinstance(val, list | tuple) else [val]
        if not any(isinstance(v, torch.Tensor) for v in values):
            continue  # sym_size, _assert_async and the like make no tensor
        if not _lowerable(node.target):
            found.append(node)
    return found


def _where(node: torch.fx.Node) -> str:
    frames, _module = fxstack.node_site(node)
    user = [f for f in frames if f[3] == "user"] or list(frames)
    if not user:
        return "an unknown line"
    file, line, func, _scope = user[0]
    return f"{file}:{line} (in {func})"


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    assert isinstance(target, torch._ops.OpOverload)  # host_nodes finds only these
    return target._schema.name


def refuse(nodes: list[torch.fx.Node]) -> NeuronUnsupportedError:
    """The compile error naming each op the device cannot lower and its line."""
    seen = dict.fromkeys(f"{_op_name(n)} at {_where(n)}" for n in nodes)
    return NeuronUnsupportedError(
        "neuron: the graph has ops the device cannot lower: " + "; ".join(seen) + ". "
        'Run them on the host as recorded CPU fallbacks with torch.compile(backend="neuron", '
        f'options={{"fallback": True}}) or {ENV}=1, or keep them out of the compiled region.'
    )


def split(gm: torch.fx.GraphModule, host: list[torch.fx.Node]) -> torch.fx.GraphModule:
    """The graph cut into runs of device ops and single host ops (submodules `submod_N`, in
    order); each submodule's `device` attribute says which it is."""
    from torch.fx.passes.split_module import split_module

    hosts = set(host)
    part = [0]
    last: list[bool | None] = [None]
    partition: dict[torch.fx.Node, int] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        on_host = node in hosts
        # a host op is a part of its own; consecutive device ops share one
        if last[0] is not None and (on_host or last[0] != on_host):
            part[0] += 1
        last[0] = on_host
        partition[node] = part[0]
    parts = split_module(gm, gm, lambda n: partition[n], keep_original_order=True)
    for name, sub in parts.named_children():
        index = int(name.rsplit("_", 1)[1])
        sub.device = not any(  # type: ignore[assignment]
            partition[n] == index and n in hosts for n in partition
        )
    return parts


class HostOp(torch.nn.Module):
    """One host op of a split graph: a CPU fallback, recorded as eager records one."""

    def __init__(
        self, gm: torch.fx.GraphModule, node: torch.fx.Node, launch_site: Callable[[], Any]
    ) -> None:
        super().__init__()
        self.gm, self.name, self.launch_site = gm, _op_name(node), launch_site
        self.site = fxstack.node_site(node)

    def forward(self, *args: Any) -> Any:
        tracking.warn_fallback(self.name)
        if not _prof._is_profiler_enabled:
            return self.gm(*args)
        spec = model.spec()
        tid = threading.get_native_id()
        seq, bwd = _rec.autograd_position()
        src = fxstack.site(self.site, self.launch_site())
        payloads = [a for a in args if isinstance(a, torch.Tensor)]
        shapes, dtypes = _rec._describe(payloads)
        t0 = time.time_ns()
        wait = max(0, model.device_idle_at() - model.modeled_now(t0)) + spec.runtime.sync_ns
        t_w = time.time_ns()
        _rec._host("sync", "sync", self.name, shapes, dtypes, tid, t0, t_w, wait, src, seq, bwd)
        in_bytes = sum(p.untyped_storage().nbytes() for p in payloads)
        t_cpu = time.time_ns()
        _rec._host("copy", "copy d2h", self.name, shapes, dtypes, tid, t_w, t_cpu,
                   _rec._copy_ns(in_bytes, spec.runtime.d2h_bytes_per_s), src, seq, bwd,
                   args={"bytes": in_bytes})  # fmt: skip
        out = self.gm(*args)
        t_done = time.time_ns()
        _rec._host("fallback", "fallback", self.name, shapes, dtypes, tid, t_cpu, t_done,
                   t_done - t_cpu, src, seq, bwd, args={"compiled": True})  # fmt: skip
        results = out if isinstance(out, list | tuple) else [out]
        out_bytes = sum(
            r.untyped_storage().nbytes() for r in results if isinstance(r, torch.Tensor)
        )
        _rec._host("copy", "copy h2d", self.name, shapes, dtypes, tid, t_done, time.time_ns(),
                   _rec._copy_ns(out_bytes, spec.runtime.h2d_bytes_per_s), src, seq, bwd,
                   args={"bytes": out_bytes})  # fmt: skip
        return out


class DevicePart(torch.nn.Module):
    """One run of device ops of a split graph: its own NEFF, launched as one program."""

    def __init__(self, program: Any) -> None:
        super().__init__()
        self.program = program

    def forward(self, *args: Any) -> Any:
        return self.program(list(args))


def split_program(
    gm: torch.fx.GraphModule, host: list[torch.fx.Node], name: str,
    device_program: Callable[[torch.fx.GraphModule, str], Any],
    launch_site: Callable[[], Any],
) -> tuple[torch.fx.GraphModule, list[Any]]:  # fmt: skip
    """The graph as parts: each device run a program from `device_program(part, name)`, each
    host op a HostOp; returns the graph of parts (called like the graph) and the programs."""
    parts = split(gm, host)
    programs = []
    for sub_name, sub in list(parts.named_children()):
        assert isinstance(sub, torch.fx.GraphModule)
        if sub.device:
            program = device_program(sub, f"{name}_part{sub_name.rsplit('_', 1)[1]}")
            programs.append(program)
            setattr(parts, sub_name, DevicePart(program))
        else:
            (node,) = host_nodes(sub)  # its copy of the host op, with the op's meta
            setattr(parts, sub_name, HostOp(sub, node, launch_site))
    return parts, programs

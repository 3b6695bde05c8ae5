"""`torch.compile(model, backend="neuron")`: each FX graph becomes one device program.

The graph compiles once per input-shape signature (a new signature of a graph already seen is
a recompile, counted in `backend.compile_stats()` and recorded). AOTAutograd traces through the
neuron tensor to its CPU payload, so forward and backward graphs are plain aten graphs that we
lower op by op, fusing elementwise chains, each kernel keeping its FX node's source line.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import events, fxstack, model, shapes, stats
from neuron_explorer.backend.runtime import record as _rec

_FUSABLE = frozenset({"elementwise", "transcendental"})
_seen: dict[str, set[tuple]] = {}  # graph code -> input-shape signatures compiled
_lock = threading.Lock()


@dataclass(frozen=True)
class Kernel:
    """One kernel of a device program: a lowered plan and the source line of its FX nodes."""

    plan: Any
    nodes: tuple[str, ...]
    src: tuple  # fxstack.node_site: the FX node's whole stack and module path


_source_line = fxstack.node_site


def _infos(values) -> list:
    from neuron_explorer.backend.costmodel import TensorInfo

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            try:
                shape = tuple(int(d) for d in v.shape)
            except (TypeError, ValueError):  # symbolic sizes: dynamic=False avoids them
                continue
            out.append(TensorInfo(shape=shape, dtype=_rec.dtype_name(v.dtype)))
    return out


def _node_tensors(node: torch.fx.Node) -> tuple[list, list]:
    """TensorInfos of a node's tensor arguments (in order) and of its results."""
    ins: list = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: ins.append(n.meta.get("val")))
    val = node.meta.get("val")
    outs = list(val) if isinstance(val, list | tuple) else [val]
    return _infos(ins), _infos(outs)


def lower_graph(gm: torch.fx.GraphModule) -> list[Kernel]:
    """Lower every aten node; consecutive elementwise nodes on one line of data fuse."""
    from neuron_explorer.backend.costmodel import fuse, lower_op

    spec = model.spec()
    kernels: list[Kernel] = []
    chain: list[tuple[Any, torch.fx.Node]] = []

    def flush() -> None:
        if not chain:
            return
        if len(chain) == 1:
            plan, node = chain[0]
        else:
            names = "_".join(p.name for p, _n in chain)
            plan = fuse([p for p, _n in chain], name=f"fused_{names}"[:120])
            node = chain[-1][1]
        kernels.append(Kernel(plan, tuple(n.name for _p, n in chain), _source_line(node)))
        chain.clear()

    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        ins, outs = _node_tensors(node)
        plan = lower_op(node.target._schema.name, inputs=ins, outputs=outs, spec=spec)
        if plan.is_empty:
            continue
        feeds_chain = bool(chain) and any(a is chain[-1][1] for a in node.all_input_nodes)
        if plan.category in _FUSABLE and (not chain or feeds_chain):
            chain.append((plan, node))
            continue
        flush()
        if plan.category in _FUSABLE:
            chain.append((plan, node))
        else:
            kernels.append(Kernel(plan, (node.name,), _source_line(node)))
    flush()
    return kernels


def to_payload_devices(gm: torch.fx.GraphModule) -> None:
    """The program runs on the CPU payloads: a factory node that asked for the device
    (`torch.ones(3, device="neuron")`, `torch.arange(n, device=x.device)`) makes its tensor
    beside them, and the `_to_copy` to the CPU that tracing put after it goes."""
    moved = set()
    for node in gm.graph.nodes:
        device = node.kwargs.get("device") if node.op == "call_function" else None
        if isinstance(device, torch.device) and device.type == "neuron":
            node.kwargs = {**node.kwargs, "device": shapes.payload_device()}
            moved.add(node)
    if not moved:
        return
    for node in list(gm.graph.nodes):
        if node.target is not torch.ops.aten._to_copy.default or node.args[0] not in moved:
            continue
        val, src = node.meta.get("val"), node.args[0].meta.get("val")
        same = set(node.kwargs) <= {"dtype", "layout", "device"} and (
            val is not None and src is not None and val.dtype == src.dtype
        )
        if same:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()


# graph id -> the call site of its forward program's latest launch. A backward program runs on
# autograd's device thread, where no user frame is live: it takes its forward's launch site, as
# eager backward kernels take their forward op's (by sequence number, capture/attribution.py)
_forward_launch: dict[str, tuple[int, str | None]] = {}


class DeviceProgram:
    """A compiled graph: running it launches its kernels as one program on the modeled device."""

    _boxed_call = False  # True once compiled: AOTAutograd then passes the args as one list

    def __init__(
        self, gm: torch.fx.GraphModule, name: str, kernels: list[Kernel], graph_id: str = "",
        backward: bool = False,
    ) -> None:  # fmt: skip
        self.gm, self.name, self.kernels = gm, name, kernels
        self.graph_id, self.backward = graph_id, backward

    def _launch_site(self) -> tuple[int, str | None]:
        if self.backward:
            forward = _forward_launch.get(self.graph_id)
            if forward is not None:
                return forward
            return _rec.call_site(3)
        launch = _forward_launch[self.graph_id] = _rec.call_site(3)
        return launch

    def __call__(self, args: list) -> Any:
        if not _prof._is_profiler_enabled:
            return self.gm(*args)
        t0 = time.time_ns()
        m0 = model.modeled_now(t0)
        out = _rec.run_hidden(self.gm, args, {})
        rt = model.spec().runtime
        flow = events.next_flow()
        tid = threading.get_native_id()
        seq, bwd = _rec.autograd_position()
        ready = m0 + rt.launch_ns
        launch = self._launch_site()
        for k in self.kernels:
            _rec.submit_kernel(k.plan, ready, self.name, (), (), tid, flow,
                               fxstack.site(k.src, launch), seq, bwd,
                               args={"fx_nodes": list(k.nodes)})  # fmt: skip
        t1 = time.time_ns()
        _rec._host("runtime", "launch", self.name, (), (), tid, t0, t1, rt.launch_ns,
                   launch, seq, bwd, flow, args={"kernels": len(self.kernels)})  # fmt: skip
        return out


def _compile(kind: str, graph_id: str):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        t0 = time.time_ns()
        to_payload_devices(gm)
        kernels = lower_graph(gm)
        program = DeviceProgram(gm, f"neuron_graph_{graph_id}_{kind}", kernels, graph_id,
                                kind == "backward")  # fmt: skip
        if _prof._is_profiler_enabled:
            rt = model.spec().runtime
            n = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            cost = rt.graph_compile_ns_base + rt.graph_compile_ns_per_node * n
            seq, bwd = _rec.autograd_position()
            _rec._host("compile", "graph compile", program.name, (), (), threading.get_native_id(),
                       t0, time.time_ns(), cost, _rec.call_site(2), seq, bwd,
                       args={"nodes": n, "kernels": len(kernels), "graph": kind})  # fmt: skip
        program._boxed_call = True  # AOTAutograd calls compiled graphs with a list of args
        return program

    return compile_graph


_skipping = False


def skip_backend_frames() -> None:
    """Dynamo must never trace the runtime itself (it runs under compiled code at run time)."""
    global _skipping
    if not _skipping:
        import torch._dynamo.trace_rules

        torch._dynamo.trace_rules.add("neuron_explorer.backend")
        _skipping = True


def no_device_constants() -> None:
    """Fake-tensor constant propagation must not make neuron tensors.

    Tracing runs a small constant's op for real when the target device is available
    (`torch.tensor(4).to(x.device)` in transformers' sliding-window cache); on the neuron
    device that real result is a NeuronTensor, which FakeTensorMode cannot keep as a constant
    (it asserts). Such a result stays a plain fake value instead, as for an unavailable device.
    Installed at registration: dynamo traces before it calls the backend.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from neuron_explorer.backend.tensor import NeuronTensor

    may_turn_const = FakeTensorMode.may_turn_const
    if getattr(may_turn_const, "_neuron", False):
        return

    def guarded(self, t: torch.Tensor) -> bool:
        return not isinstance(t, NeuronTensor) and may_turn_const(self, t)

    guarded._neuron = True  # type: ignore[attr-defined]
    FakeTensorMode.may_turn_const = guarded  # type: ignore[method-assign]


_NUMBER = re.compile(r"\b\d+\b")


def graph_key(gm: torch.fx.GraphModule) -> str:
    """What makes two graphs one graph at two shapes: its code with the numbers left out. With
    dynamic=False dynamo writes sizes into the code (`view(2, 8, 32)`), so a new batch size
    changes the text but not the graph."""
    return _NUMBER.sub("#", gm.code)


def _frame_recompiled() -> bool:
    """Dynamo compiles this frame again (compile id `F/1` and up): with automatic dynamic
    shapes (model.compile()'s default) a new batch size turns the graph symbolic, so its code
    changes and only dynamo knows it is the same frame."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    return bool(compile_id is not None and compile_id.frame_compile_id)


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Any:
    """The dynamo backend registered as "neuron" (entry point torch_dynamo_backends)."""
    from torch._dynamo.backends.common import aot_autograd

    skip_backend_frames()
    code = graph_key(gm)
    signature = tuple(
        (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__
        for x in example_inputs
    )
    with _lock:
        shapes = _seen.setdefault(code, set())
        shapes.add(signature)
        # a recompile counts against the signatures seen since reset_compile_stats(), so that
        # a reset (with torch._dynamo.reset()) starts counting afresh; _seen keeps the ids
        since = stats.graph_signatures.setdefault(code, set())
        recompile = (bool(since) and signature not in since) or _frame_recompiled()
        since.add(signature)
        stats.graph["graph_compiles"] += 1
        stats.graph["graph_recompiles"] += int(recompile)
        graph_id = f"{len(_seen) - 1}_{len(shapes) - 1}"
    if recompile and _prof._is_profiler_enabled:
        now = time.time_ns()
        _rec._host("compile", "recompile", f"neuron_graph_{graph_id}", (), (),
                   threading.get_native_id(), now, now, 0, _rec.call_site(2), -1, False,
                   args={"reason": "new input shapes", "shapes": str(signature)})  # fmt: skip
    compiler = aot_autograd(fw_compiler=_compile("forward", graph_id),
                            bw_compiler=_compile("backward", graph_id))  # fmt: skip
    return compiler(gm, example_inputs, **kwargs)

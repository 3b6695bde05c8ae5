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
from typing import Any

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend import graph_fallback, graph_lowering
from neuron_explorer.backend.graph_lowering import Kernel
from neuron_explorer.backend.runtime import events, fxstack, model, shapes, stats
from neuron_explorer.backend.runtime import record as _rec

_seen: dict[str, set[tuple]] = {}  # graph code -> input-shape signatures compiled
_lock = threading.Lock()


def lower_graph(gm: torch.fx.GraphModule, name: str = "neff") -> tuple[Any, list[Kernel]]:
    """The graph's NEFF (one launch, fused groups, intermediates in SBUF) and its kernels, at
    the sizes it was traced with."""
    return graph_lowering.lower_graph(gm, name)


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
        self, gm: torch.fx.GraphModule, name: str, neff: Any, kernels: list[Kernel],
        graph_id: str = "", backward: bool = False, place: bool = True,
    ) -> None:  # fmt: skip
        self.gm, self.name, self.neff, self.kernels = gm, name, neff, kernels
        self.graph_id, self.backward = graph_id, backward
        # a part of a split graph leaves its outputs as they are: the whole graph places them
        self._device_outputs = _device_outputs(gm) if place else frozenset()
        self._symbols = graph_lowering.input_symbols(gm)  # dynamic sizes: lowered per call
        self._at_sizes: dict[tuple, tuple[Any, list[Kernel]]] = {}

    def _lowered(self, args: list) -> tuple[Any, list[Kernel]]:
        """The NEFF and kernels at this call's sizes (a dynamic graph runs at many)."""
        if not self._symbols:
            return self.neff, self.kernels
        sizes = graph_lowering.sizes_of(self._symbols, args)
        key = tuple(sizes.values())
        found = self._at_sizes.get(key)
        if found is None:
            found = self._at_sizes[key] = graph_lowering.lower_graph(self.gm, self.name, sizes)
        return found

    def _run(self, args: list) -> Any:
        out = self.gm(*args)
        if self._device_outputs:  # made only by device factories, which run on the CPU here
            out = _on_device(out, self._device_outputs)
        return out

    def _launch_site(self) -> tuple[int, str | None]:
        return launch_site(self.graph_id, self.backward)

    def __call__(self, args: list) -> Any:
        if not _prof._is_profiler_enabled:
            return self._run(args)
        t0 = time.time_ns()
        m0 = model.modeled_now(t0)
        neff, kernels = self._lowered(args)  # before the run: a boxed call may clear args
        out = _rec.run_hidden(self._run, (args,), {})
        rt = model.spec().runtime
        flow = events.next_flow()
        tid = threading.get_native_id()
        seq, bwd = _rec.autograd_position()
        ready = m0 + rt.launch_ns
        launch = self._launch_site()
        # one launch runs the whole NEFF; its groups stay kernel events, slices of it
        groups = [
            (k.group, fxstack.site(k.src, launch),
             {"fx_nodes": list(k.nodes), "neff": self.name, "spilled_bytes": k.group.spilled_bytes,
              "neff_graph": k.graph, "neff_group": i})
            for i, k in enumerate(kernels)
        ]  # fmt: skip
        _rec.submit_neff(neff, groups, ready, self.name, tid, flow, seq, bwd)
        t1 = time.time_ns()
        _rec._host("runtime", "launch", self.name, (), (), tid, t0, t1, rt.launch_ns,
                   launch, seq, bwd, flow, args={"kernels": len(kernels), "neff": self.name})  # fmt: skip
        return out


def launch_site(graph_id: str, backward: bool) -> tuple[int, str | None]:
    """The call site a program of this graph launches from (a backward takes its forward's)."""
    if backward:
        forward = _forward_launch.get(graph_id)
        if forward is not None:
            return forward
        return _rec.call_site(3)
    launch = _forward_launch[graph_id] = _rec.call_site(3)
    return launch


class SplitProgram:
    """A compiled graph with host ops (the opt-in fallback): its device runs are programs of
    their own, its host ops recorded CPU fallbacks (graph_fallback.py)."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, host: list, name: str, graph_id: str,
                 backward: bool) -> None:  # fmt: skip
        def device_program(part: torch.fx.GraphModule, part_name: str) -> DeviceProgram:
            neff, kernels = lower_graph(part, part_name)
            return DeviceProgram(part, part_name, neff, kernels, graph_id, backward, place=False)

        self.name = name
        self._device_outputs = _device_outputs(gm)
        self.parts, self.programs = graph_fallback.split_program(
            gm, host, name, device_program, lambda: launch_site(graph_id, backward)
        )
        self.kernels = [k for p in self.programs for k in p.kernels]

    def __call__(self, args: list) -> Any:
        out = self.parts(*args)
        if self._device_outputs:
            out = _on_device(out, self._device_outputs)
        return out


def _device_outputs(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Positions of the graph's outputs that belong on the device: a CPU tensor there is a
    device factory's result, which to_payload_devices made beside the payloads."""
    (out,) = (n for n in gm.graph.nodes if n.op == "output")
    results = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    return frozenset(
        i
        for i, r in enumerate(results)
        if isinstance(r, torch.fx.Node)
        and isinstance(r.meta.get("val"), torch.Tensor)
        and r.meta["val"].device.type == "neuron"
    )


def _on_device(out: Any, where: frozenset[int]) -> Any:
    from neuron_explorer.backend.runtime import memory
    from neuron_explorer.backend.tensor import NeuronTensor, fresh

    def place(i: int, t: Any) -> Any:
        if i in where and isinstance(t, torch.Tensor) and not isinstance(t, NeuronTensor):
            memory.track(t)
            return fresh(t)
        return t

    if isinstance(out, (list, tuple)):
        return type(out)(place(i, t) for i, t in enumerate(out))
    return place(0, out)


def _compile(kind: str, graph_id: str, fallback: bool):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        t0 = time.time_ns()
        to_payload_devices(gm)
        name = f"neuron_graph_{graph_id}_{kind}"
        host = graph_fallback.host_nodes(gm)
        program: DeviceProgram | SplitProgram
        if host and not fallback:
            raise graph_fallback.refuse(host)
        if host:
            program = SplitProgram(gm, host, name, graph_id, kind == "backward")
        else:
            neff, kernels = lower_graph(gm, name)
            program = DeviceProgram(gm, name, neff, kernels, graph_id, kind == "backward")
        if _prof._is_profiler_enabled:
            rt = model.spec().runtime
            n = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            cost = rt.graph_compile_ns_base + rt.graph_compile_ns_per_node * n
            seq, bwd = _rec.autograd_position()
            _rec._host("compile", "graph compile", program.name, (), (), threading.get_native_id(),
                       t0, time.time_ns(), cost, _rec.call_site(2), seq, bwd,
                       args={"nodes": n, "kernels": len(program.kernels), "graph": kind,
                             "host_ops": len(host)})  # fmt: skip
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


def neuron_backend(
    gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None, **kwargs: Any
) -> Any:
    """The dynamo backend registered as "neuron" (entry point torch_dynamo_backends).

    `options={"fallback": True}` (or NEURON_COMPILE_FALLBACK=1) runs the graph's ops the
    device cannot lower on the host as recorded fallbacks; without it they fail the compile.
    """
    from torch._dynamo.backends.common import aot_autograd

    kwargs.pop("mode", None)  # torch.compile's mode= is inductor's; the device has one
    fallback = graph_fallback.wants_fallback(options)

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
    # an inference graph keeps its writes into its inputs (a static KV cache's new rows): the
    # NEFF writes them in place (costmodel/graph_forms.py), not eager copies after it
    compiler = aot_autograd(fw_compiler=_compile("forward", graph_id, fallback),
                            bw_compiler=_compile("backward", graph_id, fallback),
                            keep_inference_input_mutations=True)  # fmt: skip
    return compiler(gm, example_inputs, **kwargs)

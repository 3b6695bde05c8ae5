"""One dispatch path for every aten op on a neuron tensor (docs/architecture.md).

Unwrap the CPU payloads, run the op on them, wrap the results. Around that: the eager compile
cache, CPU fallbacks, float64 as float32, mixed-device errors, memory accounting and, only while
a torch.profiler session records, the runtime events (see `record.py`).
"""

from __future__ import annotations

import time

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import collectives as _collectives
from neuron_explorer.backend.runtime import composites as _composites
from neuron_explorer.backend.runtime import handoff as _handoff
from neuron_explorer.backend.runtime import (
    kernels,
    memory,
    ops,
    record,
    routing,
    shapes,
    tracking,
    unsupported,
)
from neuron_explorer.backend.runtime.payload import (
    finish_outputs,
    new_tensor,
    round_f64,
    unwrap_all,
    wrap,
    wrap_result,
)
from neuron_explorer.backend.tensor import NeuronTensor, fresh

__all__ = ["OpInfo", "copy_between", "dispatch", "finish_outputs", "new_tensor", "record_sync",
           "run_op", "unwrap_all"]  # fmt: skip

_Tensor = torch.Tensor
_F64 = torch.float64
_CPU = torch.device("cpu")
_DEVICE_TYPE = "neuron"  # what torch.utils.rename_privateuse1_backend names it
_SEQ = (list, tuple)
_now = time.time_ns
_NO_KWARGS: dict = {}  # never written: an op called without keywords shares it
_handoff_calls = _handoff._calls  # backward calls in progress
_inference_enabled = torch.is_inference_mode_enabled
# Tensor.to(dtype) by the dtype's own method: the same cast (to(dtype), copy=False, the
# preserved memory format) without to()'s overloads to parse
_CAST_METHODS = {torch.bfloat16: _Tensor.bfloat16, torch.float16: _Tensor.half,
                 torch.float32: _Tensor.float}  # fmt: skip


class OpInfo:
    """How the runtime treats one OpOverload; built once per overload."""

    __slots__ = ("func", "call", "name", "kernel", "supported", "mutates", "restrides",
                 "allows_cpu", "special", "payload_keys", "redispatch", "tensor_slots")  # fmt: skip

    def __init__(self, func: torch._ops.OpOverload) -> None:
        schema = func._schema
        self.func = func
        # the C++ op itself: OpOverload.__call__ costs ~10 us more inside __torch_dispatch__
        self.call = getattr(func, "_op", func)
        self.name = schema.name
        self.supported = ops.is_supported(func)
        self.kernel = not (func.is_view or self.name in ops.NO_KERNEL)
        self.mutates = schema.is_mutable
        # may change a mutated tensor's shape or strides: metadata ops and out= variants; an
        # in-place op with a kernel (add_, mul_, ...) keeps them, so its wrapper needs no refresh
        self.restrides = self.mutates and (
            not self.kernel or any(a.is_out for a in schema.arguments)
        )
        # CPU index tensors are allowed, as on CUDA: indexing, and index_put, which the
        # backward of x[cpu_index] runs; CTC's lengths, which CUDA's cuDNN path takes on the CPU
        self.allows_cpu = self.name in ("aten::copy_", "aten::index", "aten::index_put",
                                        "aten::index_put_", "aten::_index_put_impl_",
                                        "aten::_to_copy", "aten::_ctc_loss",
                                        "aten::_ctc_loss_backward")  # fmt: skip
        self.special = _SPECIAL.get(self.name)
        if unsupported.is_sparse_constructor(self.name):
            self.special = unsupported.refuse_sparse
        elif self.special is None and not self.supported and _is_composite(func):
            # reaches Python whole only where autograd is off (inference_mode); elsewhere
            # autograd decomposes it first, so decompose it here too rather than fall back
            self.special = _decomposed
        self.payload_keys, self.redispatch = _payload_route(func)
        host = kernels.host_kernel(func, self.call)
        if host is not self.call:  # the device computes it its own way (kernels.py)
            self.call, self.payload_keys, self.redispatch = host, None, None
        if not self.supported and self.kernel:  # a CPU fallback runs as a plain CPU call
            host = kernels.with_math_bits(self.call)
            self.call, self.payload_keys, self.redispatch = host, None, None
        assumed = shapes.data_dependent(self.name, self.call)
        if assumed is not None:  # a data-less payload's output shape takes an assumption
            self.call, self.payload_keys, self.redispatch = assumed, None, None
        if shapes.SEEN:
            self.carry_fill()
        # positional Tensor parameters: torch hands __torch_dispatch__ a Python number there for
        # a scalar operand (x * 2), which only a call (not a boxed redispatch) converts back
        self.tensor_slots = tuple(
            i
            for i, a in enumerate(schema.arguments)
            if not a.kwarg_only and isinstance(a.type, torch._C.TensorType)
        )

    def carry_fill(self) -> None:
        """In shapes-only mode, carry a one-hot mask's fill through this op (routing.py); only
        once the mode was on, so a normal run's ops keep their call as it was."""
        if self.name in routing.RULES and not getattr(self.call, "_carries_fill", False):
            self.call = routing.carrying_fill(self.name, self.call)


def _carry_fills() -> None:
    for info in list(_INFO.values()):
        info.carry_fill()


def _payload_route(func) -> tuple:
    """(keys, redispatch) that run `func` on CPU payloads without a profiler event, or
    (None, None) where the op has no CPU kernel to go to.

    A redispatch records no torch.profiler event (only a call through the dispatcher does): it
    hides the simulator's payload op for half the cost of switching record functions off and on
    (each switch copies the profiler's thread-local callbacks). It skips autograd and
    ADInplaceOrView, which a payload never needs (it does not require grad; its wrapper carries
    the version counter and view links), but keeps the conjugate and negative views' fallbacks.
    A redispatch does not skip an op's fallthrough kernels as a call does, so a key where the
    op has one is left out.
    """
    schema = func._schema
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    handle = getattr(func, "_handle", None)
    has_kernel = torch._C._dispatch_has_computed_kernel_for_dispatch_key
    if handle is None or not has_kernel(name, "CPU") or _falls_through(name, "CPU"):
        return None, None
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    for key in ("Conjugate", "Negative"):
        if not _falls_through(name, key):
            keys = keys | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
    return keys, handle.redispatch_boxed


def _is_composite(func) -> bool:
    schema = func._schema
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")


def _falls_through(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_kernel_for_dispatch_key_is_fallthrough(name, key)
    except RuntimeError:  # no kernel of the op's own: the key's backend fallback runs
        return False


_INFO: dict = {}


shapes.on_first_use(_carry_fills)


def _info(func) -> OpInfo:
    """The OpInfo of `func`, kept on the OpOverload itself: OpOverload hashes in Python, so an
    attribute read is cheaper than a dict lookup on every op."""
    try:
        return func._neuron_info
    except AttributeError:
        info = func._neuron_info = _INFO[func] = OpInfo(func)
        return info


def torch_dispatch(cls, func, types, args: tuple = (), kwargs: dict | None = None):
    """Run one aten op for neuron tensors: NeuronTensor.__torch_dispatch__ itself once the device
    registers (tensor.set_device_object), so torch's call lands here with no Python frame in
    between (one fewer on every op: ~0.4k instructions, and one call less for a with_stack
    tracer to record; issue 16)."""
    if kwargs is None:
        kwargs = _NO_KWARGS
    if _prof._is_profiler_enabled:
        # recording: the runtime call's span starts here, as early as Python sees the op, so
        # little simulator time stays on the host clock
        t0 = _now()
        if _handoff_calls:  # inside loss.backward(): the device thread's first op? (handoff.py)
            _handoff.device_op(t0)
        try:
            info = func._neuron_info
        except AttributeError:
            info = _info(func)
        if info.special is not None:
            return info.special(info, args, kwargs)
        if kwargs and "device" in kwargs and _on_host(kwargs["device"]):
            return _host_result(info, args, kwargs)
        return record.dispatch_recorded(info, args, kwargs, t0)
    try:
        info = func._neuron_info
    except AttributeError:
        info = _info(func)
    if info.special is not None:
        return info.special(info, args, kwargs)
    return run_op(info, args, kwargs)


def dispatch(func, args: tuple, kwargs: dict):
    """torch_dispatch for a call from Python (the runtime's own probes, tests)."""
    return torch_dispatch(NeuronTensor, func, None, args, kwargs)


def run_op(info: OpInfo, args: tuple, kwargs: dict):
    """The common path: compile cache, fallback, payload op, wrap, memory."""
    if kwargs and "device" in kwargs and _on_host(kwargs["device"]):
        return _host_result(info, args, kwargs)  # e.g. zeros_like(x, device="cpu")
    if _prof._is_profiler_enabled:
        return record.dispatch_recorded(info, args, kwargs, _now())
    inputs: list = []
    cpu_args, kwargs = unwrap_all(args, kwargs, inputs, info)
    if inputs and type(inputs[0][0]) is not _Tensor:  # tracing with fake payloads
        return wrap(info.call(*cpu_args, **kwargs), inputs, [])
    if info.kernel:
        if info.supported:
            tracking.note_key(info, inputs)
        else:
            tracking.warn_fallback(info.name)
    out = info.call(*cpu_args, **kwargs)
    if out is None:
        return None
    return wrap_result(info, out, inputs)


def _on_host(device) -> bool:
    return device is not None and torch.device(device).type == "cpu"


def _host_result(info: OpInfo, args: tuple, kwargs: dict):
    """An op asked to put its result on the CPU: run it on the payloads, keep the plain result."""
    cpu_args, kwargs = unwrap_all(args, kwargs, [], info)
    return info.call(*cpu_args, **kwargs)


# ---- ops with their own path: copies between host and device, scalar reads ------------------


def _copy_(info: OpInfo, args, kwargs):
    dst, src = args[0], args[1]
    return copy_between(dst, src, kwargs.get("non_blocking", False) if kwargs else False)


def copy_between(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False):
    """dst.copy_(src) where either side may be on the device: H2D, D2H or on-device copy."""
    dst_dev, src_dev = isinstance(dst, NeuronTensor), isinstance(src, NeuronTensor)
    d = dst._payload if dst_dev else dst  # type: ignore[attr-defined]  # a NeuronTensor
    s = src._payload if src_dev else src  # type: ignore[attr-defined]
    if type(d) is not _Tensor or type(s) is not _Tensor:
        d.copy_(s)
        return dst
    if dst_dev and src_dev:
        return _dispatch_plain(_info(torch.ops.aten.copy_.default), (dst, src), {})
    direction = "h2d" if dst_dev else "d2h"
    with record.host_call("copy", f"copy {direction}", "aten::copy_", (s,), direction=direction):
        if not dst_dev and s.is_meta:  # no data to copy out: the placeholder's zeros
            d.copy_(shapes.host_copy(s))
            return dst
        d.copy_(s)
        if dst_dev and d.dtype is _F64:
            round_f64(d)
    return dst


def _to_copy(info: OpInfo, args, kwargs):
    src = args[0]
    device = kwargs.get("device")
    if device is None or torch.device(device).type != "cpu":
        if not _prof._is_profiler_enabled and len(args) == 1:
            out = _cast(info, src, kwargs, device)
            if out is not None:
                return out
        return _dispatch_plain(info, args, kwargs)
    kwargs = dict(kwargs)
    kwargs["device"] = _CPU
    payload = src._payload
    if type(payload) is not _Tensor:
        return torch.ops.aten._to_copy.default(payload, **kwargs)
    with record.host_call("copy", "copy d2h", "aten::_to_copy", (payload,), direction="d2h"):
        if payload.is_meta:
            return shapes.host_copy(payload, kwargs.get("dtype"))
        out = torch.ops.aten._to_copy.default(payload, **kwargs)
        if out.untyped_storage().data_ptr() == payload.untyped_storage().data_ptr():
            out = out.clone()
    return out


def _cast(info: OpInfo, src, kwargs: dict, device):
    """A dtype-only cast on the device while nothing records, or None where the call is more
    (another layout or device, float64, an unchanged dtype, a fake payload): autocast makes one
    before every matmul and after every fp32-listed op, and its ToCopyBackward one more (80 in
    a tiny GPT-2 step), so each skips run_op's general argument handling and the C++ op's
    keyword parsing for the payload's own cast (~40 -> ~25 us a call); compile-cache counting,
    wrapping and memory accounting stay as in run_op. Recording, the plain path runs it."""
    dtype = kwargs.get("dtype")
    p = src._payload
    n = len(kwargs)
    if device is not None:
        if type(device) is not torch.device or device.type != _DEVICE_TYPE:
            return None
        n -= 1
    if "layout" in kwargs:
        if kwargs["layout"] is not torch.strided:
            return None
        n -= 1
    if n != 1 or dtype is None or dtype is p.dtype or dtype is _F64 or type(p) is not _Tensor:
        return None
    tracking.note_key(info, [(p, src)])
    # a fresh plain tensor of another dtype, never float64, so no input's wrapper, no rounding
    # and no inference-mode or math-bit mismatch: wrapped and counted directly (wrap_result's
    # checks and calls cost ~5k instructions here), its payload cast by the dtype's own method
    # (no to() signature parsing: ~6k fewer)
    method = _CAST_METHODS.get(dtype)
    out = p.to(dtype) if method is None else method(p)
    if shapes.SEEN:  # a one-hot mask cast to long keeps its fill (routing.py)
        routing.carry(p, out)
    w = fresh(out)
    memory.track(out)
    return w


def _dispatch_plain(info: OpInfo, args, kwargs):
    return run_op(info, args, kwargs)


def _local_scalar_dense(info: OpInfo, args, kwargs):
    payload = args[0]._payload
    if type(payload) is not _Tensor:
        return torch.ops.aten._local_scalar_dense.default(payload)
    with record.host_call(
        "sync", ".item()", "aten::_local_scalar_dense", (payload,), direction="d2h"
    ):
        if payload.is_meta:
            return shapes.scalar(payload)
        return torch.ops.aten._local_scalar_dense.default(payload)


def record_sync(name: str, tensor: torch.Tensor | None) -> None:
    """A host wait on the device (torch.neuron.synchronize, printing): an event when recording."""
    payloads = (tensor._payload,) if isinstance(tensor, NeuronTensor) else ()
    with record.host_call("sync", name, "", payloads, direction="d2h" if payloads else ""):
        pass


def _decomposed(info: OpInfo, args, kwargs):
    """Run the op's CompositeImplicit decomposition on the wrappers themselves.

    Under inference_mode such ops reach Python whole (no autograd kernel decomposes them
    first); `aten::to.device` takes its device positionally, so run on the payload it would
    make a neuron tensor inside a neuron tensor. Decomposed, it is `_to_copy` (or nothing).
    """
    return info.func.decompose(*args, **kwargs)


def _query(info: OpInfo, args, kwargs):
    """A metadata query torch makes of the wrappers themselves (`.data = t` asks
    `_has_compatible_shallow_copy_type`), answered on the payloads and never recorded: it is no
    runtime call, and the refresh of a restrided output asks it from inside a launch, whose
    span holds it already (recorded, its span and round trip were cut twice, and the host clock
    stalled over the ops after: an `aten::add` after `arange` came out 0 us long). A CPU
    tensor and a wrapper are never compatible: torch answers so in C++ outside
    inference_mode, and `module.to("neuron")` inside it asks here (issue 28)."""
    if sum(isinstance(a, NeuronTensor) for a in args[:2]) == 1:
        return False
    cpu_args, kwargs = unwrap_all(args, kwargs, [], info)
    return info.call(*cpu_args, **kwargs)


def _record_stream(info: OpInfo, args, kwargs) -> None:
    """tensor.record_stream(s): nothing to keep, as the payload's memory is freed only with the
    wrapper, after every queue has run (the device runs kernels in launch order)."""
    return None


_SPECIAL = {
    **dict.fromkeys(("aten::" + n for n in _composites.COMPOSITES), _composites.special),
    "aten::_has_compatible_shallow_copy_type": _query,
    "aten::record_stream": _record_stream,
    "aten::to": _decomposed,
    "aten::copy_": _copy_,
    "aten::_to_copy": _to_copy,
    "aten::_local_scalar_dense": _local_scalar_dense,
    "aten::item": _local_scalar_dense,  # reaches Python itself under inference_mode
}
# torch.distributed's ops run on the payloads through the process group (runtime/collectives.py)
_SPECIAL.update(dict.fromkeys(_collectives.KIND_OF, _collectives.run))

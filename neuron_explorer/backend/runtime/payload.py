"""The bottom of the op path: a neuron op's CPU payloads in, its wrapped results out.

Both dispatch paths (`dispatch.run_op`, and `record.dispatch_recorded` while a profiler
records) and the ops with a path of their own go through these functions, and this module
imports nothing of theirs, so the path runs one way: tensor -> dispatch -> record -> payload ->
tensor's wrapper and memory accounting. `info` is the op's `dispatch.OpInfo`.
"""

from __future__ import annotations

import torch

from neuron_explorer.backend.runtime import memory, tracking
from neuron_explorer.backend.runtime import shapes as _shapes
from neuron_explorer.backend.tensor import NeuronTensor, new_tensor, refresh

__all__ = [
    "finish_outputs", "new_tensor", "run_hidden", "run_payload", "unwrap_all", "wrap",
    "wrap_result",
]  # fmt: skip

_Tensor = torch.Tensor
_F64 = torch.float64
_CPU = torch.device("cpu")
_SEQ = (list, tuple)
_TENSOR_OR_NONE = (_Tensor, type(None))  # built once: `_Tensor | None` makes a union per call
_inference_enabled = torch.is_inference_mode_enabled
_enable_rf = torch._C._autograd._enable_record_function
_modes = torch._C._len_torch_dispatch_stack


def mixed_device_error(name: str) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"neuron:0 and cpu! (when checking arguments for {name})"
    )


def _unwrap(a, inputs: list, info):
    if isinstance(a, _Tensor):
        if isinstance(a, NeuronTensor):
            p = a._payload
            inputs.append((p, a))
            return p
        if a.dim() != 0 and not info.allows_cpu and a.device.type == "cpu":
            raise mixed_device_error(info.name)
        if type(a) is not _Tensor and a.device.type == "neuron":
            # a factory's result while torch.compile traces (`torch.ones(3, device="neuron")`):
            # a fake tensor on the device, not a wrapper; its value belongs beside the payloads
            # (meta ones in shapes-only mode, as compiler.to_payload_devices places it at run)
            return a.to(_shapes.payload_device())
        return a
    if type(a) in _SEQ and a and isinstance(a[0], _TENSOR_OR_NONE):
        return type(a)(_unwrap(x, inputs, info) for x in a)
    return a


def unwrap_all(args: tuple, kwargs: dict, inputs: list, info) -> tuple[list, dict]:
    """CPU payloads in place of neuron tensors; `inputs` collects (payload, wrapper) pairs."""
    cpu_args = []
    for a in args:
        if type(a) is NeuronTensor:
            p = a._payload
            inputs.append((p, a))
            cpu_args.append(p)
        elif type(a) in _SEQ:  # sizes (view, reshape, expand) stay, with no call; tensors
            # (cat, stack) are unwrapped: by the first element, as _unwrap decides
            cpu_args.append(
                _unwrap(a, inputs, info) if a and isinstance(a[0], _TENSOR_OR_NONE) else a
            )
        elif isinstance(a, _Tensor):
            cpu_args.append(_unwrap(a, inputs, info))
        else:
            cpu_args.append(a)
    if kwargs:
        kwargs = {k: _unwrap(v, inputs, info) for k, v in kwargs.items()}
        if "device" in kwargs:
            kwargs["device"] = _payload_device(inputs) if _shapes.SEEN else _CPU
    return cpu_args, kwargs


def _payload_device(inputs: list):
    """Where an op's new payload goes once data-less payloads exist: beside its inputs' (a
    meta payload's results are meta), else where the mode puts new ones."""
    return inputs[0][0].device if inputs else _shapes.payload_device()


def wrap(o, inputs: list, new: list):
    """A payload result as a neuron tensor: an input's own wrapper when it is an input, else a
    new wrapper, collected in `new`."""
    if isinstance(o, _Tensor):
        for p, w in inputs:
            if o is p:
                return w
        inference = o.is_inference()
        if inference is not _inference_enabled():
            # the wrapper is an inference tensor exactly when its payload is: a view of a
            # normal tensor under inference_mode is normal (torch then sets its version
            # counter), and a view of an inference tensor outside it is an inference tensor
            with torch.inference_mode(inference):
                w = NeuronTensor(o)
        else:
            w = NeuronTensor(o)
        new.append(w)
        return w
    if type(o) in _SEQ:
        return type(o)(wrap(x, inputs, new) for x in o)
    return o


def wrap_result(info, out, inputs: list, new: list | None = None):
    """A kernel op's result: an in-place op returns its first input's wrapper (refreshed where
    it restrides), any other op its wrapped outputs (collected in `new`), accounted."""
    if inputs and out is inputs[0][0]:
        w = inputs[0][1]
        if info.mutates:
            if info.restrides:
                refresh(w)
            if out.dtype is _F64:
                finish_outputs(info, [], inputs)
        return w
    if new is None:
        new = []
    result = wrap(out, inputs, new)
    if new or info.mutates:  # otherwise finish_outputs has nothing to do
        finish_outputs(info, new, inputs)
    return result


def finish_outputs(info, new: list, inputs: list) -> None:
    """Memory accounting for fresh outputs and float64 rounding of computed results; after an
    in-place restride (`transpose_`, `t_`, nn.GRU's batch_first output) the wrapper follows."""
    if info.restrides and not info.kernel:
        for _p, w in inputs:
            refresh(w)
    if info.kernel:
        f64 = False
        for w in new:
            p = w._payload
            if not info.func.is_view:
                memory.track(p)
            if p.dtype is _F64:
                f64 = True
                round_f64(p)
        if info.mutates:
            for p, w in inputs:
                refresh(w)
                if p.dtype is _F64:
                    f64 = True
                    round_f64(p)
        if f64:
            tracking.warn_float64()


def round_f64(p: torch.Tensor) -> None:
    """float64 is computed as float32 on the device: keep only float32 precision."""
    if p.numel():
        p.copy_(p.to(torch.float32))


def run_hidden(func, args, kwargs):
    """Run a payload op without a torch.profiler event: it is simulator work, not the user's op."""
    _enable_rf(False)
    try:
        return func(*args, **kwargs)
    finally:
        _enable_rf(True)


def run_payload(info, args, kwargs):
    """`run_hidden` for an op on real CPU payloads: straight to its CPU kernel where it has one
    (dispatch._payload_route: a redispatch records no profiler event, for half the cost).
    Not while a TorchDispatchMode is active (dynamo's FakeTensorMode): a redispatch to the CPU
    key skips the mode stack and would return a real tensor where the mode wants a fake one.
    Nor once a payload was data-less (shapes-only mode): a CPU kernel must never see a meta
    tensor, and the dispatcher sends one to its Meta kernel."""
    redispatch = info.redispatch
    if redispatch is not None and not _modes() and not _shapes.SEEN:
        n = len(args)
        for i in info.tensor_slots:  # a Tensor slot holding a number or None: a call converts it
            if i < n and not isinstance(args[i], _Tensor):
                break
        else:  # a loop, not a helper: one call fewer on every recorded launch (issue 16)
            return redispatch(info.payload_keys, *args, **kwargs)
    return run_hidden(info.call, args, kwargs)

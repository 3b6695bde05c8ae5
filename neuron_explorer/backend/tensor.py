"""The `neuron` tensor: a wrapper subclass on device neuron:0 that holds a CPU payload.

Every aten op on a neuron tensor reaches `__torch_dispatch__`, which hands it to the runtime;
the payload is where the numbers live, so results equal a CPU run with the same seed.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_explorer.backend.runtime import memory, shapes

DEVICE = torch.device("privateuseone", 0)  # rebound to neuron:0 by _registration.register()


_NO_KWARGS: dict = {}
_make_wrapper = torch.Tensor._make_wrapper_subclass
_DATA: Any = torch._C.TensorBase.data  # the C++ getset descriptor of Tensor.data (not in the stubs)
_STRIDED = torch.strided
_Tensor = torch.Tensor


def _unbound(*args: Any) -> Any:
    raise RuntimeError("neuron: the device is not registered (neuron_explorer.backend.register())")


# The runtime above this module, bound at registration (this module imports none of it):
# every op's dispatch, and the sync a print of a tensor's values is
_dispatch: Any = _unbound
_on_print: Any = _unbound


def set_device_object(device: torch.device, dispatch: Any, on_print: Any,
                      torch_dispatch: Any = None) -> None:  # fmt: skip
    """Called once the backend is renamed, so wrappers report `neuron:0` and their ops reach
    the runtime's `dispatch(func, args, kwargs)`; `on_print(name, tensor)` records the sync.
    `torch_dispatch`, the runtime's own `__torch_dispatch__(cls, func, types, args, kwargs)`,
    becomes the class's: torch then calls the runtime with no frame of ours in between."""
    global DEVICE, _dispatch, _on_print
    DEVICE = device
    _dispatch, _on_print = dispatch, on_print
    if torch_dispatch is not None:
        NeuronTensor.__torch_dispatch__ = classmethod(torch_dispatch)  # type: ignore[assignment]


def _mirror_math_bits(wrapper: torch.Tensor, payload: torch.Tensor) -> None:
    """A lazy conjugate or negative view keeps its bit on the wrapper too: the bits live on the
    tensor that reaches the dispatcher, whose Conjugate/Negative fallbacks resolve them before
    an op reaches `__torch_dispatch__` (inside it those keys are excluded, so a bit left only on
    the payload would be ignored and the values silently wrong)."""
    if payload.is_conj():
        torch._C._set_conj(wrapper, True)
    if payload.is_neg():
        torch._C._set_neg(wrapper, True)


def _make(cls: type, payload: torch.Tensor, requires_grad: bool) -> Any:
    """The wrapper for `payload` with the fewest keywords that describe it: argument parsing
    is most of `_make_wrapper_subclass`'s cost (callgrind: the strides keyword ~2.9k
    instructions, requires_grad ~0.3k); the defaults make the same wrapper. Without strides it
    gets the row-major ones, exactly the payload's where that is a contiguous plain tensor with
    no dimension of size 0 or 1 (`is_contiguous` ignores those dimensions' strides, which can
    then be anything). Plain tensors only: a fake payload's symbolic sizes would add guards.
    The wrapper keeps `_meta`, its payload's (shape, dtype), read here once."""
    shape = payload.shape
    dtype = payload.dtype
    offset = payload.storage_offset()
    t: Any
    if offset:
        t = _make_wrapper(cls, shape, strides=payload.stride(), storage_offset=offset,
                          dtype=dtype, device=DEVICE, requires_grad=requires_grad)  # fmt: skip
    elif type(payload) is _Tensor and payload.is_contiguous() and 1 not in shape and 0 not in shape:
        if requires_grad:
            t = _make_wrapper(cls, shape, dtype=dtype, device=DEVICE, requires_grad=True)
        else:
            t = _make_wrapper(cls, shape, dtype=dtype, device=DEVICE)
    elif requires_grad:
        t = _make_wrapper(cls, shape, strides=payload.stride(), dtype=dtype, device=DEVICE,
                          requires_grad=True)  # fmt: skip
    else:
        t = _make_wrapper(cls, shape, strides=payload.stride(), dtype=dtype, device=DEVICE)
    t._meta = (shape, dtype)
    return t


class NeuronTensor(torch.Tensor):
    """A tensor on the modeled neuron device; `_payload` is the CPU tensor that holds its data."""

    _payload: torch.Tensor
    # (shape, dtype) of `_payload`, set wherever `_payload` is: the eager compile cache's key
    # part (tracking.note_key), read from the instance's dict where a property read on this
    # subclass costs ~1.5k instructions and a payload's shape ~0.7k
    _meta: tuple

    @staticmethod
    def __new__(cls, payload: torch.Tensor, requires_grad: bool = False) -> NeuronTensor:
        try:
            if payload.layout is not _STRIDED:
                raise RuntimeError("sparse")
            t = _make(cls, payload, requires_grad)
        except (NotImplementedError, RuntimeError):  # no strided storage: sparse or nested
            from neuron_explorer.backend.runtime.unsupported import error_for

            if payload.layout is _STRIDED and not payload.is_nested:
                raise
            raise error_for(payload) from None
        t._payload = payload
        if payload.is_conj() or payload.is_neg():
            _mirror_math_bits(t, payload)
        return t

    # No __init__: torch.Tensor's is object's, which (with __new__ defined) takes the arguments
    # in C; a Python one is a frame more on every wrapper made (~0.4k instructions)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or _NO_KWARGS)

    @property
    def data(self) -> torch.Tensor:
        return _DATA.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        # `param.data = t` swaps the wrapper's metadata in C++; the payload must follow it
        if not isinstance(new, NeuronTensor):
            raise RuntimeError(
                f"neuron: .data of a neuron tensor can only be set to a neuron tensor, got {new.device}"
            )
        _DATA.__set__(self, new)
        self._payload = new._payload
        self._meta = new._meta

    # Traceable-subclass protocol: torch.compile (AOTAutograd) traces through to the payload.
    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_payload"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], meta: Any, outer_size, outer_stride):
        payload = inner["_payload"]
        if type(payload) is torch.Tensor:  # a compiled program's output: device memory
            return new_tensor("compiled", payload)
        return NeuronTensor(payload)

    def __reduce_ex__(self, proto):
        # Saved as a CPU tensor plus the device, like other storage-less backends (xla, mtia).
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.cpu(), self.dtype, str(self.device), self.requires_grad),
        )

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        if type(self._payload) is not torch.Tensor:  # fake or functional payload while tracing
            return f"NeuronTensor({self._payload!r})"
        _on_print("print", self)
        if self._payload.is_meta:  # shapes-only mode: no values to print
            return shapes.repr_of(self.shape, self.dtype, self.device)
        return _format(self)

    def tolist(self) -> Any:
        if self._payload.is_meta:
            shapes.placeholder(".tolist()")  # warned for its line: the copy below is not
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(
            "can't convert neuron:0 device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]


def _format(t: NeuronTensor) -> str:
    """torch's tensor repr, computed on the payload (no device ops), with the neuron suffixes."""
    from torch import _tensor_str

    p = t._payload.detach()
    body = _tensor_str._tensor_str(p, len("tensor(")) if p.numel() or p.dim() == 1 else "[]"
    suffixes = [f"device='{t.device}'"]
    if p.numel() == 0 and p.dim() != 1:
        suffixes.insert(0, f"size={tuple(p.shape)}")
    if p.dtype not in (torch.get_default_dtype(), torch.int64, torch.bool):
        suffixes.append(f"dtype={p.dtype}")
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{type(t.grad_fn).__name__}>")
    elif t.requires_grad:
        suffixes.append("requires_grad=True")
    return _tensor_str._add_suffixes("tensor(" + body, suffixes, len("tensor("), False)


def refresh(wrapper: NeuronTensor) -> None:
    """After an op resized or restrided the payload (out=, resize_, t_), match the wrapper to it."""
    p = wrapper._payload
    if (wrapper.shape, wrapper.stride(), wrapper.storage_offset()) != (
        p.shape,
        p.stride(),
        p.storage_offset(),
    ):
        _DATA.__set__(wrapper, NeuronTensor(p))
        wrapper._payload = p
        wrapper._meta = (p.shape, p.dtype)


def new_tensor(name: str, payload: torch.Tensor) -> NeuronTensor:
    """Wrap a payload the device just allocated (a factory's, a compiled program's output):
    its bytes count as device memory until its last tensor is gone."""
    w = NeuronTensor(payload)
    memory.track(payload)
    return w


def wrap(payload: torch.Tensor) -> NeuronTensor:
    """Wrap a CPU tensor as a neuron tensor without copying."""
    return NeuronTensor(payload)


def fresh(payload: torch.Tensor) -> NeuronTensor:
    """The wrapper of a payload a device op just allocated as a plain CPU tensor (a cast's
    result): strided, no conjugate or negative bit, made in the current inference mode, so
    `NeuronTensor(payload)`'s checks have nothing to find; skipping them and the type call
    (`__new__` and `__init__` through Python) saves ~4k instructions a wrapper."""
    t = _make(NeuronTensor, payload, False)
    t._payload = payload
    return t

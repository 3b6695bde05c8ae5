"""Areas of PyTorch the neuron device does not run, each refused with one clear error that names
the area and the workaround (TorchNeuron's beta lists torch.sparse and torch.nested as
unsupported), never an internal error from deep inside torch."""

from __future__ import annotations

import torch

_libs: list[torch.library.Library] = []


class NeuronUnsupportedError(NotImplementedError):
    """A tensor or op from an area of PyTorch the neuron device does not support."""


def error_for(payload: torch.Tensor) -> NeuronUnsupportedError:
    """The error for a tensor that cannot live on the device (sparse or nested)."""
    if payload.is_nested:
        return NeuronUnsupportedError(
            "neuron: torch.nested tensors (strided layout) are not supported on the neuron "
            "device; keep the nested tensor on the CPU, or pad it first "
            "(torch.nested.to_padded_tensor(t, 0.0).to('neuron'))"
        )
    return NeuronUnsupportedError(_SPARSE.format(layout=payload.layout))


def is_sparse_constructor(name: str) -> bool:
    """`aten::_sparse_coo_tensor_unsafe`, `aten::_sparse_compressed_tensor_unsafe`, ...: what
    moving a sparse tensor to the device builds from its (dense) parts."""
    return name.startswith(("aten::_sparse_", "aten::sparse_")) and "tensor" in name


def refuse_sparse(info, args, kwargs):
    """The dispatch special of the sparse constructors."""
    layout = "torch.sparse_coo" if "coo" in info.name else "compressed (CSR, CSC, BSR, BSC)"
    raise NeuronUnsupportedError(_SPARSE.format(layout=layout))


_SPARSE = (
    "neuron: torch.sparse tensors (layout {layout}) are not supported on the neuron device; "
    "keep the sparse tensor on the CPU, or make it dense first (t.to_dense().to('neuron'))"
)


def _refuse_sparse_op(op, *args, **kwargs):
    raise NeuronUnsupportedError(_SPARSE.format(layout=f"sparse, in {op}"))


def _refuse_nested(op, *args, **kwargs):
    raise NeuronUnsupportedError(
        f"neuron: torch.nested tensors (strided layout) are not supported on the neuron device "
        f"({op}); keep the nested tensor on the CPU, or pad it first "
        "(torch.nested.to_padded_tensor(t, 0.0).to('neuron'))"
    )


def register() -> None:
    """Refuse every op of a nested or sparse tensor on the device (their dispatch keys have no
    kernels), should one be made."""
    if _libs:
        return
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_refuse_nested, dispatch_key="NestedTensorPrivateUse1")
    lib.fallback(_refuse_sparse_op, dispatch_key="SparsePrivateUse1")
    lib.fallback(_refuse_sparse_op, dispatch_key="SparseCsrPrivateUse1")
    _libs.append(lib)

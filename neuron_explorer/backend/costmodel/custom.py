"""Kernels users declare for their own ops (`neuron_explorer.backend.register_kernel`).

A `torch.library` custom op has no device kernel the model knows: its cost is what the user
declares, FLOPs (and optionally bytes read) as numbers or as functions of the input shapes,
on one engine. The kernel reads its inputs, runs that many operations on the engine and
writes its outputs, pipelined like any other kernel (lowering._lower_declared). A TensorE
kernel declares its GEMMs instead (or FLOPs, taken as full 128x128 tiles), and lowers as the
device's own matmuls do (lowering._lower_matmul).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import ceil

from neuron_explorer.vocab.engines import TENSOR_ENGINE

from .ops import Gemm
from .plan import TensorInfo

Cost = int | Callable[..., int]  # a number, or a function of each input's shape (a tuple)
# a function of each input's shape: the (batch, M, K, N) products of a TensorE kernel
Gemms = Callable[..., Sequence[Gemm]]
ENGINES = (TENSOR_ENGINE, "VectorE", "ScalarE", "GpSimdE")


@dataclass(frozen=True)
class DeclaredKernel:
    """What the user declared for one op: its engine, FLOPs (or a TensorE kernel's GEMMs) and
    (None: its inputs) bytes read."""

    engine: str
    flops: Cost | None
    bytes_read: Cost | None = None
    gemms: Gemms | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.gemms is not None and self.engine != TENSOR_ENGINE:
            raise ValueError(f"gemms= declares TensorE work, not {self.engine}'s")
        if self.flops is None and self.gemms is None:
            raise ValueError("declare the kernel's flops= (or, on TensorE, its gemms=)")


_DECLARED: dict[str, DeclaredKernel] = {}


def declare(op: str, kernel: DeclaredKernel) -> None:
    """Register `kernel` as the device kernel of the op named `op` (`mylib::my_op`)."""
    _DECLARED[op] = kernel


def declared(op: str) -> DeclaredKernel | None:
    return _DECLARED.get(op)


def is_matmul(op: str) -> bool:
    """A declared TensorE kernel: the compiler lays out its operands as a matmul's."""
    kernel = _DECLARED.get(op)
    return kernel is not None and kernel.engine == TENSOR_ENGINE


def _value(cost: Cost, inputs: Sequence[TensorInfo]) -> int:
    return int(cost(*(t.shape for t in inputs)) if callable(cost) else cost)


def reads_of(kernel: DeclaredKernel, inputs: Sequence[TensorInfo]) -> list[int]:
    """Bytes read per read of one call: the declared bytes, else each input's."""
    if kernel.bytes_read is None:
        return [t.nbytes for t in inputs]
    return [_value(kernel.bytes_read, inputs)]


def work_of(kernel: DeclaredKernel, inputs: Sequence[TensorInfo]) -> tuple[int, list[int]]:
    """(FLOPs, bytes read per read) of one call of a declared kernel on these inputs."""
    assert kernel.flops is not None  # declared with it unless on TensorE
    return max(1, _value(kernel.flops, inputs)), reads_of(kernel, inputs)


def gemms_of(kernel: DeclaredKernel, inputs: Sequence[TensorInfo], dim: int) -> list[Gemm]:
    """The GEMMs of one call of a TensorE kernel: the declared ones, else its FLOPs as
    full `dim` x `dim` tiles (the array's peak rate)."""
    if kernel.gemms is not None:
        found = kernel.gemms(*(t.shape for t in inputs))
        return [(int(b), int(m), int(k), int(n)) for b, m, k, n in found]
    assert kernel.flops is not None
    flops = max(1, _value(kernel.flops, inputs))
    return [(1, dim, dim, max(1, ceil(flops / (2 * dim * dim))))]

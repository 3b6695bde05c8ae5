"""Kernels users declare for their own ops (`neuron_explorer.backend.register_kernel`).

A `torch.library` custom op has no device kernel the model knows: its cost is what the user
declares, FLOPs (and optionally bytes read) as numbers or as functions of the input shapes,
on one engine. The kernel reads its inputs, runs that many operations on the engine and
writes its outputs, pipelined like any other kernel (lowering._lower_declared).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .plan import TensorInfo

Cost = int | Callable[..., int]  # a number, or a function of each input's shape (a tuple)
ENGINES = ("VectorE", "ScalarE", "GpSimdE")


@dataclass(frozen=True)
class DeclaredKernel:
    """What the user declared for one op: its engine, FLOPs and (None: its inputs) bytes read."""

    engine: str
    flops: Cost
    bytes_read: Cost | None = None


_DECLARED: dict[str, DeclaredKernel] = {}


def declare(op: str, kernel: DeclaredKernel) -> None:
    """Register `kernel` as the device kernel of the op named `op` (`mylib::my_op`)."""
    if kernel.engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {kernel.engine!r}")
    _DECLARED[op] = kernel


def declared(op: str) -> DeclaredKernel | None:
    return _DECLARED.get(op)


def _value(cost: Cost, inputs: Sequence[TensorInfo]) -> int:
    return int(cost(*(t.shape for t in inputs)) if callable(cost) else cost)


def work_of(kernel: DeclaredKernel, inputs: Sequence[TensorInfo]) -> tuple[int, list[int]]:
    """(FLOPs, bytes read per read) of one call of a declared kernel on these inputs."""
    flops = max(1, _value(kernel.flops, inputs))
    if kernel.bytes_read is None:
        return flops, [t.nbytes for t in inputs]
    return flops, [_value(kernel.bytes_read, inputs)]

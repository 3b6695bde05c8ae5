"""`register_kernel`: a `torch.library` custom op gets a device kernel with a declared cost.

Without one, a custom op on the device is a CPU fallback (eager) and fails a compiled graph
unless its fallback is opted into (graph_fallback.py). With one, it is a device kernel of its
own, eager and compiled, at the user's line: the payloads run the op's CPU implementation (the
numbers), and the modeled cost is the declared one (costmodel/custom.py).
"""

from __future__ import annotations

from typing import Any

from neuron_explorer.backend.costmodel import custom, lowering
from neuron_explorer.backend.runtime import dispatch, ops


def op_name(op: Any) -> str:
    """`ns::name` of a custom op given as its CustomOpDef, OpOverloadPacket, OpOverload or name."""
    if isinstance(op, str):
        return op
    for attr in ("_qualname", "_qualified_op_name"):
        name = getattr(op, attr, None)
        if isinstance(name, str):
            return name
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return schema.name
    raise TypeError(f"register_kernel: not an op: {op!r}")


def register_kernel(
    op: Any, *, flops: custom.Cost | None = None, bytes_read: custom.Cost | None = None,
    engine: str = "VectorE", gemms: custom.Gemms | None = None,
) -> None:  # fmt: skip
    """Give the custom op `op` a device kernel costing `flops` operations on `engine` (and
    `bytes_read` from HBM, by default its inputs' bytes); each cost is a number or a function
    of the input shapes, e.g. `flops=lambda x: 4 * x[0] * x[1]`. On TensorE, `gemms` (a function
    of the input shapes giving (batch, M, K, N) products) prices it as the device's matmuls."""
    name = op_name(op)
    custom.declare(name, custom.DeclaredKernel(engine, flops, bytes_read, gemms))
    ops.ENGINE_OF[name] = engine
    ops.CATEGORY_OF[name] = "custom"
    lowering._CACHE.clear()  # plans lowered before the declaration
    for func, info in list(dispatch._INFO.items()):  # dispatched before: as a fallback
        if info.name == name:
            del dispatch._INFO[func]
            del func._neuron_info

"""Device kernels for custom ops that libraries define with `torch.library`.

Transformers runs MoE experts through its own op `transformers::grouped_mm_fallback` (and
its backward) where torch's grouped matmul does not compile (float32 weights under
torch.compile): a loop of `torch.mm` over each expert's rows, opaque to the compiler. On the
device it is what it computes, a grouped matmul on TensorE, priced as `aten::_grouped_mm` is
(costmodel/ops.py `grouped_gemms`: the experts' rows split as uniform routing splits them).
The kernels are declared by the ops' names through `register_kernel`, the hook users have, so
nothing here imports the library: an op that never gets defined is never called.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from neuron_explorer.backend.costmodel.custom import Gemms
from neuron_explorer.backend.costmodel.ops import Gemm, grouped_gemms
from neuron_explorer.backend.custom_kernels import register_kernel

Shape = tuple[int, ...]


def _grouped_mm(x: Shape, w: Shape, offs: Shape) -> list[Gemm]:
    """input (S, K) @ weight (E, K, N), each expert's rows by `offs` (E,)."""
    return grouped_gemms(x, w, offs[0])


def _grouped_mm_backward(x: Shape, w: Shape, offs: Shape, grad: Shape) -> list[Gemm]:
    """grad_input = grad (S, N) @ weight[e].T per expert; grad_weight[e] = input.T @ grad over
    each expert's rows."""
    experts = offs[0]
    wt = (w[0], w[2], w[1])
    return grouped_gemms(grad, wt, experts) + grouped_gemms((x[1], x[0]), grad, experts)


KERNELS: dict[str, Gemms] = {
    "transformers::grouped_mm_fallback": _grouped_mm,
    "transformers::grouped_mm_fallback_backward": _grouped_mm_backward,
}


def register() -> None:
    """Declare each library op's TensorE kernel (by name: the library is not imported)."""
    for name, gemms in KERNELS.items():
        register_kernel(name, engine="TensorE", gemms=gemms)


# The kernels priced by `grouped_gemms`, by kernel name (an op's name without its namespace):
# their groups are uniform routing's in every mode, whatever the offsets hold
GROUPED_KERNELS = frozenset({"_grouped_mm", *(name.split("::")[1] for name in KERNELS)})


def uniform_groups(events: Iterable[Any]) -> dict[str, int]:
    """Kernels among `events` (RuntimeEvents) priced with uniform groups, counted by name: a
    kernel of its own, or a NEFF's kernel holding the op (its `fx_nodes`)."""
    counts: dict[str, int] = {}
    for e in events:
        if e.kind != "kernel":
            continue
        nodes = (e.args or {}).get("fx_nodes") or ()
        for name in GROUPED_KERNELS.intersection([e.name, *nodes]):
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))

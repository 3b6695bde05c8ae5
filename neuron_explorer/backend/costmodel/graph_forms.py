"""Two forms a compiled graph holds that eager ops do not (costmodel/graph.py reads them):

- **A collective in the NEFF.** A tensor-parallel graph's all-reduces (DTensor's, traced as
  `_c10d_functional` ops) run inside the NEFF on the collective cores, between the compute
  that makes their input and the compute that reads their result, as transformers-neuronx and
  NxD Inference compile a decoder layer's two all-reduces into the token's one graph. One
  instruction on the `CC` lane lasting the collective's modeled transfer
  (costmodel/collectives.py); the host launches nothing for it.
- **An in-place update of a graph input.** A static KV cache's `index_copy_` is traced as a
  functional update of the whole cache and a `copy_` of it back into the graph input. The
  compiler writes the new rows in place instead (the cache is an input and output of the
  NEFF at one address): the update reads and writes the rows only, and its readers (the
  attention) read the cache from HBM as the graph input it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from . import ops
from .collectives import ALL_GATHER, collective_cost
from .lowering import lower_op
from .plan import CC, Instr, KernelPlan, TensorInfo
from .spec import DeviceSpec

Value = tuple[int, int]
# functional updates of a tensor whose written part is their last tensor argument
_UPDATES = frozenset({"index_copy", "index_put", "_unsafe_index_put", "scatter", "slice_scatter",
                      "select_scatter"})  # fmt: skip


def collective_plan(
    op: str, kind: str, ranks: int, inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo], spec: DeviceSpec,
) -> KernelPlan:  # fmt: skip
    """A collective of a compiled graph: one `CC` instruction lasting its modeled transfer
    among `ranks` (the buffer priced as the eager runtime prices it: an all-gather's gathered
    output, else its input)."""
    priced = outputs if kind == ALL_GATHER and outputs else inputs
    nbytes = priced[0].nbytes if priced else 0
    cost = collective_cost(kind, nbytes, ranks, spec.collectives)
    instr = Instr(CC, kind, max(1, cost.transfer_ns))
    return KernelPlan(ops.base_name(op), op, (instr,), 0, 0, 0, tuple(inputs), tuple(outputs),
                      (), ops.COLLECTIVE, spec.name)  # fmt: skip


def in_place_updates(graph: Sequence[Any], alias: Callable[[Value], Value]) -> dict[int, int]:
    """{update op: its copy_ op} for each functional update of a graph input that the graph
    copies back into that same input (`copy_(x, index_copy(x, ...))`)."""
    found: dict[int, int] = {}
    for c, g in enumerate(graph):
        if ops.base_name(g.op) != "copy" or len(g.sources) < 2:
            continue
        dest, src = g.sources[0], g.sources[1]
        if dest is None or src is None or alias(dest)[0] >= 0:
            continue
        u = alias(src)[0]
        if u < 0 or ops.base_name(graph[u].op) not in _UPDATES or not graph[u].sources:
            continue
        target = graph[u].sources[0]
        if target is not None and alias(target) == alias(dest):
            found[u] = c
    return found


def as_row_write(g: Any) -> Any:
    """An update as the compiler runs it in place: it reads its index and its rows (its last
    tensor argument), not the tensor it writes into, and its result is those rows."""
    return replace(g, inputs=g.inputs[1:], sources=g.sources[1:], outputs=g.inputs[-1:],
                   exported=(True,))  # fmt: skip


def update_plan(g: Any, spec: DeviceSpec) -> KernelPlan:
    """An in-place update (`as_row_write`'s op): its rows written, its index read."""
    return lower_op(g.op, g.inputs, g.outputs, spec)

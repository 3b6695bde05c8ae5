"""A compiled graph's aten ops as the cost model's GraphOps, lowered to one NEFF.

Under automatic dynamic shapes (`model.compile()`'s default) a graph's sizes are symbolic: it
is lowered at the sizes of each call it runs with (`sizes_of`), so a dynamic graph compiled at
batch 3 and run at batch 8 is priced at batch 8, and reading a size never adds a guard.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from neuron_explorer.backend.runtime import fxstack, model
from neuron_explorer.backend.runtime import record as _rec


@dataclass(frozen=True)
class Kernel:
    """One fused group of a device program: its slice of the NEFF, its FX nodes and the source
    line of the node that anchors it (the matmul a bias and activation fused into)."""

    group: Any  # costmodel.graph.NeffGroup
    nodes: tuple[str, ...]
    src: tuple  # fxstack.node_site: the FX node's whole stack and module path
    graph: str = ""  # the key of the graph its NEFF was lowered from (recorded_graphs)

    @property
    def plan(self) -> Any:
        return self.group.plan


Sizes = dict  # sympy symbol of a dynamic size -> its value in one call


def _traced_size(d: Any, sizes: Sizes | None) -> int | None:
    """A size: a symbolic one (automatic dynamic shapes) by its value in the call (`sizes`),
    else by its hint, read without a guard, since int() would specialize the graph to that
    size and recompile it for every batch size; None for a size with no value."""
    if not isinstance(d, torch.SymInt):
        return int(d)
    expr = d.node.expr
    if sizes:
        value = expr.xreplace(sizes)
        if isinstance(value, int) or value.is_number:
            return int(value)
    hint = d.node.hint
    return int(hint) if hint is not None else None


def _info(value, sizes: Sizes | None = None) -> Any:
    from neuron_explorer.backend.costmodel import TensorInfo

    if not isinstance(value, torch.Tensor):
        return None
    sized = [_traced_size(d, sizes) for d in value.shape]
    shape = tuple(d for d in sized if d is not None)
    if len(shape) != len(sized):  # a size known only at run time (data-dependent)
        return None
    return TensorInfo(
        shape=shape, dtype=_rec.dtype_name(value.dtype), transposed=_rec.is_transposed(value)
    )


def graph_ops(
    gm: torch.fx.GraphModule, sizes: Sizes | None = None
) -> tuple[list, list[torch.fx.Node]]:
    """The graph's aten ops as the cost model's GraphOps (each input traced to the op and output
    that made it), and the FX node of each."""
    from neuron_explorer.backend.costmodel import TensorInfo
    from neuron_explorer.backend.costmodel.graph import GraphOp

    value: dict[torch.fx.Node, tuple[int, int]] = {}
    found: list[tuple[torch.fx.Node, str, list, list, list]] = []
    placeholders = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":  # graph input k is (-1 - k, 0)
            placeholders += 1
            value[node] = (-placeholders, 0)
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and node.args[0] in value:
            value[node] = (value[node.args[0]][0], int(node.args[1]))
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        args: list[torch.fx.Node] = []
        torch.fx.node.map_arg((node.args, node.kwargs), args.append)
        ins, sources = [], []
        for a in args:
            info = _info(a.meta.get("val"), sizes)
            if info is not None:
                ins.append(info)
                sources.append(value.get(a))
        val = node.meta.get("val")
        outs = [_info(v, sizes) for v in (val if isinstance(val, list | tuple) else [val])]
        value[node] = (len(found), 0)
        found.append((node, node.target._schema.name, ins, outs, sources))
    exported: set[tuple[int, int]] = set()
    for node in gm.graph.nodes:
        if node.op == "output":
            torch.fx.node.map_arg(node.args, lambda n: exported.add(value.get(n, (-1, -1))))
    graph = []
    for i, (node, name, ins, outs, sources) in enumerate(found):
        if all(t is None for t in outs):  # no tensor result: lowering takes it as in place
            outs = []
        # a non-tensor result keeps its place (an empty tensor), so getitem's index still fits
        kept = tuple(t if t is not None else TensorInfo((0,)) for t in outs)
        graph.append(GraphOp(name, tuple(ins), kept, tuple(sources),
                             tuple((i, j) in exported for j in range(len(kept))),
                             _collective(node, name)))  # fmt: skip
    return graph, [f[0] for f in found]


def _collective(node: torch.fx.Node, name: str) -> tuple[str, int] | None:
    """A collective node's (kind, ranks of its group): it runs in the NEFF (graph_forms.py)."""
    from neuron_explorer.backend.runtime import collectives

    kind = collectives.KIND_OF.get(name)
    if kind is None:
        return None
    group = collectives._group_of(tuple(node.args))
    return kind, group.size() if group is not None else 1


def lower_graph(
    gm: torch.fx.GraphModule, name: str = "neff", sizes: Sizes | None = None
) -> tuple[Any, list[Kernel]]:
    """The graph's NEFF (one launch, fused groups, intermediates in SBUF) and its kernels, at
    the sizes of one call (`sizes`) or as traced."""
    from neuron_explorer.backend.costmodel.graph import lower_graph as lower_neff

    graph, nodes = graph_ops(gm, sizes)
    neff = lower_neff(graph, name, model.spec())
    key = _remember(graph)
    kernels = [
        Kernel(g, tuple(nodes[i].name for i in g.ops), fxstack.node_site(nodes[g.ops[0]]), key)
        for g in neff.groups
    ]
    return neff, kernels


# graph key -> its rows (costmodel/graph_record.py): every graph this process lowered, for a
# capture to keep the ones its kernels came from, so that `whatif --chip` lowers them again
_graphs: dict[str, tuple] = {}


def _remember(graph: list) -> str:
    from neuron_explorer.backend.costmodel.graph_record import graph_key, to_rows

    rows = to_rows(graph)
    key = graph_key(rows)
    _graphs.setdefault(key, rows)
    return key


def recorded_graphs(keys: Any) -> dict[str, tuple]:
    """The rows of each graph named in `keys` that this process lowered."""
    return {k: _graphs[k] for k in keys if k in _graphs}


def input_symbols(gm: torch.fx.GraphModule) -> tuple[tuple[int, int, Any], ...]:
    """(input index, dimension, symbol) of each graph input size that is a plain symbol: what
    a call's arguments bind. Empty for a graph of static sizes."""
    found = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
            found.append((i, -1, val.node.expr))
        if not isinstance(val, torch.Tensor):
            continue
        for dim, d in enumerate(val.shape):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                found.append((i, dim, d.node.expr))
    return tuple(found)


def sizes_of(symbols: tuple[tuple[int, int, Any], ...], args: list) -> Sizes:
    """Each symbol's value in this call's arguments."""
    sizes: Sizes = {}
    for i, dim, symbol in symbols:
        arg = args[i] if i < len(args) else None
        if dim < 0 and isinstance(arg, int):
            sizes[symbol] = arg
        elif isinstance(arg, torch.Tensor) and dim < arg.dim():
            sizes[symbol] = int(arg.shape[dim])
    return sizes

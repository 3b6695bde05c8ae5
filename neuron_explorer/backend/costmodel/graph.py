"""A compiled graph as the Neuron compiler runs it: one NEFF, one launch, ops fused, SBUF kept.

neuronx-cc turns a whole graph into one NEFF that the runtime launches once. The model of it:

- **Fusion**: an elementwise, transcendental, reduction, norm or softmax op that consumes an
  output of the group before it joins that group (a matmul's bias, activation and cast run on
  its PSUM tiles; a chain of elementwise ops runs tile by tile), and so does one over as many
  elements as an all-elementwise group before it (loop fusion); it launches nothing and moves
  nothing to HBM.
- **SBUF residency** (graph_groups.py, which builds each group's kernel): an intermediate
  that a later group reads stays in SBUF while the live intermediates fit
  `sbuf_bytes * policy.sbuf_resident_share`; past that it is spilled: written to HBM by its
  producer and read back by each consumer. Graph inputs (weights, activations) are read from
  HBM (once, when later groups read them too and they fit) and graph outputs written to it.
- **Overlap** (graph_neff.py, which issues the groups as one NEFF): the NEFF is one
  schedulable plan. A group's compute waits only for the groups that produce its inputs (their
  last compute when the input stayed in SBUF, their stores when it spilled), so independent
  ops overlap on idle engines; a group's loads wait only for the earlier group whose operands
  would overflow SBUF's staging share with theirs to start computing (the next ops' weights
  are prefetched under the current op's compute).

Each group remains a kernel (its instructions are a slice of the NEFF's), so ops stay visible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from . import custom, graph_forms, ops
from .graph_groups import Built, GraphFacts, Sbuf, Value, build_group
from .graph_neff import NeffGroup, NeffPlan, assemble_neff
from .lowering import lhs_index, lower_op
from .plan import KernelPlan, TensorInfo
from .spec import DeviceSpec, get_spec

__all__ = ["FUSABLE", "GraphOp", "NeffGroup", "NeffPlan", "Value", "lower_graph"]

# ops that run on a producer's tiles in SBUF (engine passes with no layout change of their own)
FUSABLE = frozenset({ops.ELEMENTWISE, ops.TRANSCENDENTAL, ops.REDUCTION, ops.NORM, ops.SOFTMAX})


@dataclass(frozen=True)
class GraphOp:
    """One aten op of a graph: its tensors, and where each input comes from.

    `sources[i]` is the (op index, output index) that produced input i; graph input k is
    (-1 - k, 0), and None an input of unknown origin (read from HBM); `exported[j]` says the
    graph returns output j (it must reach HBM).
    """

    op: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    sources: tuple[Value | None, ...]
    exported: tuple[bool, ...] = ()
    # a collective's (kind, ranks of its group), as costmodel/collectives.py names the kind
    collective: tuple[str, int] | None = None


def _group_ops(plans: Sequence[KernelPlan], graph: Sequence[GraphOp], alias) -> list[list[int]]:
    """Op indices per group: a fusable op joins the latest group when it reads one of its
    outputs or runs over as many elements as that all-fusable group; every other op starts a
    group, and a declared custom kernel takes no other op. Views (empty plans) belong to none."""
    groups: list[list[int]] = []
    owner: dict[int, int] = {}  # op index -> group index
    loop: int | None = None  # elements of the latest group's loop, when it is all fusable ops
    for i, (plan, gop) in enumerate(zip(plans, graph, strict=True)):
        if plan.is_empty:
            continue
        producers = {owner.get(alias(s)[0]) for s in gop.sources if s is not None}
        elems = max((t.numel for t in gop.outputs), default=0)
        fusable = plan.category in FUSABLE
        # a user's own kernel (ops.CUSTOM) is opaque to the compiler, and a collective runs on
        # the collective cores: nothing joins either
        sealed = bool(groups) and plans[groups[-1][0]].category in (ops.CUSTOM, ops.COLLECTIVE)
        if groups and fusable and not sealed and (len(groups) - 1 in producers or elems == loop):
            # on the latest group's tiles: its consumer, or a sibling over the same elements
            # (loop fusion: the compiler runs independent elementwise chains in one tile loop)
            groups[-1].append(i)
        else:
            groups.append([i])
            loop = elems if fusable else None
        owner[i] = len(groups) - 1
    return groups


def lower_graph(
    graph: Sequence[GraphOp], name: str = "neff", spec: DeviceSpec | None = None,
    faster: Mapping[int, float] | None = None,
) -> NeffPlan:  # fmt: skip
    """The NEFF of a graph (ops in topological order, as an FX graph lists them); `faster`
    (op index -> factor) makes those ops' work in their groups that many times faster."""
    spec = spec or get_spec()
    # a view's output is its input's storage: resolve values through views
    alias_of: dict[Value, Value] = {}
    for i, g in enumerate(graph):
        if ops.classify(g.op) == ops.VIEW and g.sources and g.sources[0] is not None:
            for j in range(len(g.outputs)):
                alias_of[(i, j)] = alias_of.get(g.sources[0], g.sources[0])

    def alias(v: Value) -> Value:
        while v in alias_of:  # a view of an in-place update: the graph input it wrote into
            v = alias_of[v]
        return v

    updates = graph_forms.in_place_updates(graph, alias)
    graph = list(graph)
    for u in updates:  # its result is the graph input it wrote into, read back from HBM
        target = graph[u].sources[0]
        assert target is not None  # in_place_updates found it a graph input
        alias_of[(u, 0)] = alias(target)
        graph[u] = graph_forms.as_row_write(graph[u])
    copies_back = set(updates.values())
    plans = [_plan_of(i, g, alias, updates, copies_back, spec) for i, g in enumerate(graph)]

    exported: set[Value] = set()
    for i, g in enumerate(graph):
        exported.update(alias((i, j)) for j, e in enumerate(g.exported) if e)
    exported.update((u, 0) for u in updates)  # the rows an update writes reach HBM
    groups = _group_ops(plans, graph, alias)
    group_of = {i: gi for gi, members in enumerate(groups) for i in members}
    last_use: dict[Value, int] = {}  # value -> last group reading it
    for i, g in enumerate(graph):
        if i in group_of:
            for s in g.sources:
                if s is not None:
                    last_use[alias(s)] = group_of[i]
    facts = GraphFacts(graph, plans, alias, group_of, exported, last_use, spec, faster or {})
    sbuf = Sbuf(spec.sbuf_bytes * spec.policy.sbuf_resident_share)
    built: list[Built] = []
    for gi, members in enumerate(groups):
        built.append(build_group(gi, members, facts, sbuf))
        sbuf.release(gi, last_use)
    return assemble_neff(name, built, groups, spec)


def _plan_of(i: int, g: GraphOp, alias, updates, copies_back, spec: DeviceSpec) -> KernelPlan:
    """The op's kernel as a member of the NEFF (graph_forms.py: collectives on the collective
    cores, in-place updates of a graph input writing their rows only)."""
    if g.collective is not None:
        kind, ranks = g.collective
        return graph_forms.collective_plan(g.op, kind, ranks, g.inputs, g.outputs, spec)
    if i in copies_back:  # the update before it already wrote into the input
        return lower_op("aten::alias", g.inputs[:1], g.inputs[:1], spec)
    if i in updates:
        return graph_forms.update_plan(g, spec)
    return lower_op(g.op, _laid_out(g, alias), g.outputs, spec)


def _laid_out(g: GraphOp, alias) -> tuple[TensorInfo, ...]:
    """A matmul's inputs as the compiler lays them out: an A made inside the graph comes K-major
    from its producer (which computes its result transposed, swapping its own operands), so
    only an A read from HBM as the graph got it is transposed on TensorE."""
    if ops.classify(g.op) != ops.MATMUL and not custom.is_matmul(g.op):
        return g.inputs
    first = lhs_index(g.op)
    source = g.sources[first] if first < len(g.sources) else None
    if source is None or alias(source)[0] < 0:
        return g.inputs
    a = g.inputs[first]
    return (*g.inputs[:first], replace(a, transposed=True), *g.inputs[first + 1 :])

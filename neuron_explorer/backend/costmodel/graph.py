"""A compiled graph as the Neuron compiler runs it: one NEFF, one launch, ops fused, SBUF kept.

neuronx-cc turns a whole graph into one NEFF that the runtime launches once. The model of it:

- **Fusion**: an elementwise, transcendental, reduction, norm or softmax op that consumes an
  output of the group before it joins that group (a matmul's bias, activation and cast run on
  its PSUM tiles; a chain of elementwise ops runs tile by tile), and so does one over as many
  elements as an all-elementwise group before it (loop fusion); it launches nothing and moves
  nothing to HBM.
- **SBUF residency**: an intermediate that a later group reads stays in SBUF while the live
  intermediates fit `sbuf_bytes * policy.sbuf_resident_share`; past that it is spilled: written
  to HBM by its producer and read back by each consumer. Graph inputs (weights, activations)
  are read from HBM (once, when later groups read them too and they fit) and graph outputs
  written to it.
- **Overlap**: the NEFF is one schedulable plan. A group's compute waits only for the groups
  that produce its inputs (their last compute when the input stayed in SBUF, their stores when
  it spilled), so independent ops overlap on idle engines; a group's loads wait only for the
  earlier group whose operands would overflow SBUF's staging share with theirs to start
  computing (the next ops' weights are prefetched under the current op's compute).

Each group remains a kernel (its instructions are a slice of the NEFF's), so ops stay visible.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace

from . import custom, graph_forms, ops
from .lowering import _pass, assemble, lhs_index, lower_op
from .plan import DMA, Compute, Instr, KernelPlan, TensorInfo
from .spec import DeviceSpec, get_spec

# ops that run on a producer's tiles in SBUF (engine passes with no layout change of their own)
FUSABLE = frozenset({ops.ELEMENTWISE, ops.TRANSCENDENTAL, ops.REDUCTION, ops.NORM, ops.SOFTMAX})
Value = tuple[int, int]  # (index of the producing op, index of its output)


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


@dataclass(frozen=True)
class NeffGroup:
    """One fused group of a NEFF: its kernel (HBM traffic after residency), the graph ops it
    runs, its instructions' place in the NEFF plan, and the SBUF bytes it spilled."""

    plan: KernelPlan
    ops: tuple[int, ...]
    instr_index: tuple[int, ...]  # where each of the plan's instructions is in the NEFF's
    spilled_bytes: int


@dataclass(frozen=True)
class NeffPlan:
    """A compiled graph: `plan` is every group's instructions as one unit for the timeline."""

    name: str
    plan: KernelPlan
    groups: tuple[NeffGroup, ...]


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
    graph: Sequence[GraphOp], name: str = "neff", spec: DeviceSpec | None = None
) -> NeffPlan:
    """The NEFF of a graph (ops in topological order, as an FX graph lists them)."""
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
    capacity = spec.sbuf_bytes * spec.policy.sbuf_resident_share
    resident: dict[Value, tuple[int, int]] = {}  # value -> (group holding it in SBUF, bytes)
    spilled: set[Value] = set()
    built: list[tuple[KernelPlan, set[int], set[int], int]] = []  # plan, deps, spilled, bytes
    for gi, members in enumerate(groups):
        plan, sbuf_deps, hbm_deps, spill = _build_group(
            gi, members, graph, plans, spec, alias, group_of, exported, last_use, resident,
            spilled, capacity,
        )  # fmt: skip
        built.append((plan, sbuf_deps, hbm_deps, spill))
        for v in [v for v, last in last_use.items() if last <= gi and v in resident]:
            del resident[v]
    return _assemble_neff(name, built, groups, spec)


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


def _build_group(gi, members, graph, plans, spec, alias, group_of, exported, last_use, resident,
                 spilled, capacity) -> tuple[KernelPlan, set[int], set[int], int]:  # fmt: skip
    """One group's kernel with only its HBM traffic, and the groups it waits for."""
    inside = set(members)
    loaded: set[Value] = set()  # graph inputs and spilled values this group loads
    reads: list[int] = []
    ins: list[TensorInfo] = []
    sbuf_deps: set[int] = set()  # producer groups whose output this one reads from SBUF
    hbm_deps: set[int] = set()  # ... or from HBM, after they spilled it
    computes: list[Compute] = []
    for i in members:
        g, plan = graph[i], plans[i]
        skipped = 0  # bytes of this op's inputs that never come from HBM
        for t, s in zip(g.inputs, g.sources, strict=True):
            v = alias(s) if s is not None else None
            if v is not None and (v[0] in inside or v in loaded):
                skipped += t.nbytes
            elif v is not None and v in resident:
                skipped += t.nbytes
                sbuf_deps.add(resident[v][0])
            else:
                ins.append(t)
                if v is not None:
                    loaded.add(v)
                if v is not None and v[0] in group_of:
                    hbm_deps.add(group_of[v[0]])
        # the op's own HBM reads (a gather's rows, a matmul's re-reads) less what SBUF holds
        reads.append(max(0, plan.bytes_read - skipped))
        if not _folds_into_activation(i, members, graph, plans, alias, spec):
            computes.extend(plan.computes or _copy_work(spec, plan))
    writes: list[int] = []
    outs: list[TensorInfo] = []
    spill = 0
    for i in members:
        for j, t in enumerate(graph[i].outputs):
            v = (i, j)
            needed_later = last_use.get(v, -1) > gi
            if v in exported:
                writes.append(t.nbytes)
                outs.append(t)
            if not needed_later:
                continue
            used = sum(b for _g, b in resident.values())
            if used + t.nbytes <= capacity:
                resident[v] = (gi, t.nbytes)
            elif v not in exported:  # SBUF is full: the producer writes it out for its readers
                spilled.add(v)
                spill += t.nbytes
                writes.append(t.nbytes)
                outs.append(t)
    for v in loaded:  # a graph input later groups read too stays in SBUF while it fits
        nbytes = next(t.nbytes for i in members for t, s in zip(graph[i].inputs, graph[i].sources,
                      strict=True) if s is not None and alias(s) == v)  # fmt: skip
        used = sum(b for _g, b in resident.values())
        if last_use.get(v, -1) > gi and v not in spilled and used + nbytes <= capacity:
            resident[v] = (gi, nbytes)
    first = plans[members[0]]
    if first.category == ops.COLLECTIVE:  # the collective cores move its data, not the DMA
        return first, sbuf_deps - {gi}, hbm_deps - {gi}, spill
    work = [plans[i] for i in members]
    gname = first.name if len(work) == 1 else "fused_" + "_".join(p.name for p in work)
    op = first.op if len(work) == 1 else "+".join(p.op for p in work)
    category = first.category if len(work) == 1 else "fused"
    gemms = tuple(gm for p in work for gm in p.gemms)
    loop = None if gemms else spec.policy.loop_max_stages  # a matmul-free loop: finer stages
    plan = assemble(spec, gname[:120], op, category, tuple(ins), tuple(outs), reads,
                    _place_tensor_scalar(spec, computes), writes, gemms, loop)  # fmt: skip
    sbuf_deps.discard(gi)
    hbm_deps.discard(gi)
    return plan, sbuf_deps, hbm_deps, spill


_AFFINE = frozenset({"mul", "neg", "add", "sub", "rsub", "div"})


def _folds_into_activation(i, members, graph, plans, alias, spec: DeviceSpec) -> bool:
    """An affine op by a scalar whose one reader is the next op, a ScalarE activation, costs
    nothing: ScalarE computes func(x * scale + bias) in one instruction at the cost of func
    alone ([nki-arch]: "Instruction Combination"; neuronx-cc's silu is activation(exp,
    scale=-1), its AdamW activation(sqrt, scale=1000))."""
    at = members.index(i)
    own = plans[i].computes
    if at + 1 == len(members) or len(own) != 1 or own[0].opcode != "tensor_scalar":
        return False
    if ops.base_name(graph[i].op) not in _AFFINE or any(graph[i].exported):
        return False
    nxt = plans[members[at + 1]].computes
    if len(nxt) != 1 or nxt[0].opcode != "activation" or nxt[0].engine != spec.scalar.name:
        return False
    readers = [k for k, g in enumerate(graph) for src in g.sources
               if src is not None and alias(src) == (i, 0)]  # fmt: skip
    return readers == [members[at + 1]]


def _place_tensor_scalar(spec: DeviceSpec, computes: list[Compute]) -> list[Compute]:
    """Each tensor_scalar of a group on whichever of VectorE and ScalarE has less of the
    group's work so far: both engines run it (nki.isa.tensor_scalar) and neuronx-cc's own
    kernels leave the engine to the compiler, so a chain of scalar ops spreads over both,
    placed against the work only one of them can run."""
    vec, sca = spec.vector.name, spec.scalar.name

    def movable(c: Compute) -> bool:
        return c.opcode == "tensor_scalar" and c.engine == vec and c.flops > 0

    load = {vec: 0.0, sca: 0.0}  # the work only one engine can run, then each placed one
    for c in computes:
        if c.engine in load and not movable(c):
            load[c.engine] += c.dur_ns
    placed = []
    for c in computes:
        if movable(c):
            moved = _pass(spec, spec.scalar, "tensor_scalar", c.flops, c.sbuf_bytes // c.flops)
            if load[sca] + moved.dur_ns < load[vec] + c.dur_ns:
                c = moved
            load[c.engine] += c.dur_ns
        placed.append(c)
    return placed


def _copy_work(spec: DeviceSpec, plan: KernelPlan) -> tuple[Compute, ...]:
    """A copy (clone, cat, a layout change) inside a NEFF moves its tiles on VectorE."""
    elems = max((t.numel for t in plan.outputs), default=1)
    size = max((t.itemsize for t in plan.outputs), default=4)
    return (_pass(spec, spec.vector, "tensor_copy", elems, size, 0),)


def _assemble_neff(name, built, groups, spec: DeviceSpec) -> NeffPlan:
    """Concatenate the groups' instructions into one plan with the cross-group dependencies,
    then issue each group's stores after the next group's first loads: DMA queues run in issue
    order, and a store waiting for its compute must not hold back the next op's prefetch."""
    nq = spec.dma_queues
    instrs: list[Instr] = []
    last_compute: list[int] = []  # per group: its last compute instruction in the NEFF
    first_compute: list[int] = []
    stores: list[tuple[int, ...]] = []
    heads: list[list[int]] = []  # per group: the loads issued before its first compute
    writes: list[list[int]] = []  # per group: its stores to HBM
    rotation = 0
    loaded: list[int] = [0]  # HBM bytes the groups before each one load into SBUF
    staging = spec.sbuf_bytes * (1 - spec.policy.sbuf_resident_share)
    for gi, (plan, sbuf_deps, hbm_deps, _spill) in enumerate(built):
        base = len(instrs)
        extra = {last_compute[d] for d in sbuf_deps} | {s for d in hbm_deps for s in stores[d]}
        prefetch = _prefetch_dep(gi, loaded, plan.bytes_read, first_compute, staging)
        loaded.append(loaded[-1] + plan.bytes_read)
        first_c = -1
        mine: list[int] = []
        head: list[int] = []
        for k, ins in enumerate(plan.instrs):
            deps = tuple(d + base for d in ins.deps)
            if ins.engine == DMA:
                queue = (ins.queue + rotation) % nq
                if not ins.deps:  # a load: an earlier group has started computing
                    deps = prefetch
                    if first_c < 0:
                        head.append(base + k)
                elif ins.bytes_written and not ins.bytes_read:
                    mine.append(base + k)
                ins = ins._replace(queue=queue)
            elif first_c < 0:
                first_c = base + k
                deps = tuple(sorted(set(deps) | extra))
            instrs.append(ins._replace(deps=deps))
        rotation = (rotation + plan.dma_queues_used) % nq
        computes = [base + k for k, ins in enumerate(plan.instrs) if ins.engine != DMA]
        first_compute.append(first_c)
        last_compute.append(computes[-1] if computes else (first_compute[gi - 1] if gi else -1))
        stores.append(tuple(mine) or ((last_compute[-1],) if last_compute[-1] >= 0 else ()))
        heads.append(head)
        writes.append(mine)
    order = _issue_order(built, heads, writes)
    where = {old: new for new, old in enumerate(order)}
    issued = [instrs[old]._replace(deps=tuple(sorted(where[d] for d in instrs[old].deps)))
              for old in order]  # fmt: skip
    out: list[NeffGroup] = []
    base = 0
    for gi, (plan, *_rest, spill) in enumerate(built):
        index = tuple(where[old] for old in range(base, base + len(plan.instrs)))
        base += len(plan.instrs)
        out.append(NeffGroup(_slice(plan, issued, index), tuple(groups[gi]), index, spill))
    whole = KernelPlan(name, name, tuple(issued), sum(p.flops for p, *_ in built),
                       sum(p.bytes_read for p, *_ in built), sum(p.bytes_written for p, *_ in built),
                       (), (), (), "neff", spec.name,
                       tuple(g for p, *_ in built for g in p.gemms))  # fmt: skip
    return NeffPlan(name, whole, tuple(out))


def _issue_order(built, heads: list[list[int]], stores: list[list[int]]) -> list[int]:
    """Old indices in issue order: each group's stores move after the next group's head loads
    (they depend only on their own group's compute, already issued)."""
    order: list[int] = []
    deferred: list[int] = []
    base = 0
    for gi, (plan, *_rest) in enumerate(built):
        head = heads[gi]
        order.extend(head)
        order.extend(deferred)
        mine = set(stores[gi]) if gi + 1 < len(built) else set()
        skip = set(head) | mine
        order.extend(i for i in range(base, base + len(plan.instrs)) if i not in skip)
        deferred = [i for i in range(base, base + len(plan.instrs)) if i in mine]
        base += len(plan.instrs)
    order.extend(deferred)
    return order


def _prefetch_dep(
    gi: int, loaded: list[int], mine: int, first_compute: list[int], staging: float
) -> tuple[int, ...]:
    """What a group's loads wait for: the latest earlier group whose operands, with every later
    group's and this one's, would not fit SBUF's staging share has started computing (the
    compiler prefetches as far ahead as SBUF holds the operands). `loaded` holds the running
    sums of the groups' loads (loaded[h + 1] - loaded[h]: group h's)."""
    # the latest h with loaded[gi] - loaded[h] + mine > staging, i.e. loaded[h] below `limit`
    limit = loaded[gi] + mine - staging
    h = bisect_left(loaded, limit, 0, gi) - 1
    if h < 0:
        return ()
    return (first_compute[h],) if first_compute[h] >= 0 else ()


def _slice(plan: KernelPlan, issued: Sequence[Instr], index: tuple[int, ...]) -> KernelPlan:
    """The group's kernel as an event sees it: its NEFF instructions (queues as placed), with
    only the dependencies inside the group."""
    local = {n: k for k, n in enumerate(index)}
    instrs = tuple(
        issued[n]._replace(deps=tuple(local[d] for d in issued[n].deps if d in local))
        for n in index
    )
    return KernelPlan(plan.name, plan.op, instrs, plan.flops, plan.bytes_read, plan.bytes_written,
                      plan.inputs, plan.outputs, plan.computes, plan.category, plan.spec,
                      plan.gemms)  # fmt: skip


def group_span(plan: KernelPlan, index: Sequence[int], offsets: Sequence[int]) -> tuple[int, int]:
    """A group's kernel span in its NEFF, placed with instruction start `offsets`: to its last
    end, from its first instruction, or for a group after the NEFF's first from its compute:
    the loads it prefetched under earlier groups are on the DMA lanes, not in its span, so a
    NEFF's kernels tile its span instead of stacking their prefetches."""
    mine = [offsets[n] for n in index]
    end = max((o + i.dur_ns for o, i in zip(mine, plan.instrs, strict=True)), default=0)
    work = mine
    if index and index[0] != 0:
        work = [o for o, i in zip(mine, plan.instrs, strict=True)
                if i.engine != DMA or i.bytes_written]  # fmt: skip
    return min(work or mine, default=0), end

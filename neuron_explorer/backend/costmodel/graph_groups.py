"""One fused group of a compiled graph as a kernel: only the HBM traffic SBUF does not absorb.

costmodel/graph.py groups a graph's ops; this module builds each group's kernel in graph order,
keeping an intermediate that a later group reads in SBUF while the live ones fit
`sbuf_bytes * policy.sbuf_resident_share` and spilling it to HBM past that (written by its
producer, read back by each consumer). Graph inputs are read from HBM (once, when later groups
read them too and they fit) and graph outputs written to it. Each group also says which groups
it waits for: those whose outputs it reads from SBUF, and those whose spilled outputs it reads
back from HBM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import ops
from .lowering import _pass, assemble
from .plan import Compute, KernelPlan, TensorInfo
from .spec import DeviceSpec

if TYPE_CHECKING:
    from .graph import GraphOp

Value = tuple[int, int]  # (index of the producing op, index of its output)
# a group's kernel, the groups it reads from SBUF, those it reads back from HBM, bytes spilled
Built = tuple[KernelPlan, set[int], set[int], int]


@dataclass(frozen=True)
class GraphFacts:
    """What building any group reads of the whole graph: its ops and their own kernels, values
    resolved through views, each op's group, the values that reach HBM, each value's last
    reading group."""

    graph: Sequence[GraphOp]
    plans: Sequence[KernelPlan]
    alias: Callable[[Value], Value]
    group_of: dict[int, int]
    exported: set[Value]
    last_use: dict[Value, int]
    spec: DeviceSpec
    # op index -> factor: that op's work in its group (engine passes, its own HBM bytes) made
    # this many times faster (`whatif --speedup` on a compiled graph)
    faster: Mapping[int, float] = field(default_factory=dict)


@dataclass
class Sbuf:
    """The values SBUF holds between groups (value -> (group holding it, bytes)), and those
    spilled to HBM because it was full."""

    capacity: float
    resident: dict[Value, tuple[int, int]] = field(default_factory=dict)
    spilled: set[Value] = field(default_factory=set)

    def fits(self, nbytes: int) -> bool:
        return sum(b for _g, b in self.resident.values()) + nbytes <= self.capacity

    def release(self, gi: int, last_use: dict[Value, int]) -> None:
        """Free the values no group after `gi` reads."""
        for v in [v for v, last in last_use.items() if last <= gi and v in self.resident]:
            del self.resident[v]


@dataclass
class _Reads:
    """A group's inputs as it reads them: from HBM (`ins`, `reads`) or from SBUF."""

    loaded: set[Value] = field(default_factory=set)  # graph inputs and spilled values it loads
    reads: list[int] = field(default_factory=list)
    ins: list[TensorInfo] = field(default_factory=list)
    sbuf_deps: set[int] = field(default_factory=set)  # groups whose output it reads from SBUF
    hbm_deps: set[int] = field(default_factory=set)  # ... or from HBM, after they spilled it
    computes: list[Compute] = field(default_factory=list)
    factors: list[float] = field(default_factory=list)  # each compute's op's speedup (1: none)


def build_group(gi: int, members: list[int], facts: GraphFacts, sbuf: Sbuf) -> Built:
    """One group's kernel with only its HBM traffic, and the groups it waits for."""
    spec, plans = facts.spec, facts.plans
    got = _reads(members, facts, sbuf)
    writes, outs, spill = _writes(gi, members, facts, sbuf)
    _keep_inputs(gi, members, got.loaded, facts, sbuf)
    first = plans[members[0]]
    if first.category == ops.COLLECTIVE:  # the collective cores move its data, not the DMA
        return first, got.sbuf_deps - {gi}, got.hbm_deps - {gi}, spill
    work = [plans[i] for i in members]
    gname = first.name if len(work) == 1 else "fused_" + "_".join(p.name for p in work)
    op = first.op if len(work) == 1 else "+".join(p.op for p in work)
    category = first.category if len(work) == 1 else "fused"
    gemms = tuple(gm for p in work for gm in p.gemms)
    loop = None if gemms else spec.policy.loop_max_stages  # a matmul-free loop: finer stages
    plan = assemble(spec, gname[:120], op, category, tuple(got.ins), tuple(outs), got.reads,
                    _place_tensor_scalar(spec, got.computes, got.factors), writes, gemms,
                    loop)  # fmt: skip
    got.sbuf_deps.discard(gi)
    got.hbm_deps.discard(gi)
    return plan, got.sbuf_deps, got.hbm_deps, spill


def _reads(members: list[int], facts: GraphFacts, sbuf: Sbuf) -> _Reads:
    """Each member's inputs: from inside the group or SBUF (free), or loaded from HBM once."""
    inside = set(members)
    got = _Reads()
    for i in members:
        g, plan = facts.graph[i], facts.plans[i]
        f = facts.faster.get(i, 1.0)
        skipped = 0  # bytes of this op's inputs that never come from HBM
        for t, s in zip(g.inputs, g.sources, strict=True):
            v = facts.alias(s) if s is not None else None
            if v is not None and (v[0] in inside or v in got.loaded):
                skipped += t.nbytes
            elif v is not None and v in sbuf.resident:
                skipped += t.nbytes
                got.sbuf_deps.add(sbuf.resident[v][0])
            else:
                got.ins.append(t)
                if v is not None:
                    got.loaded.add(v)
                if v is not None and v[0] in facts.group_of:
                    got.hbm_deps.add(facts.group_of[v[0]])
        # the op's own HBM reads (a gather's rows, a matmul's re-reads) less what SBUF holds
        got.reads.append(_faster(max(0, plan.bytes_read - skipped), f))
        if not _folds_into_activation(i, members, facts):
            work = plan.computes or _copy_work(facts.spec, plan)
            got.computes.extend(c._replace(dur_ns=c.dur_ns / f) if f != 1 else c for c in work)
            got.factors.extend([f] * len(work))
    return got


def _writes(
    gi: int, members: list[int], facts: GraphFacts, sbuf: Sbuf
) -> tuple[list[int], list[TensorInfo], int]:
    """The group's stores: its exported outputs, and those later groups read that SBUF cannot
    hold (spilled); the rest stay resident."""
    writes: list[int] = []
    outs: list[TensorInfo] = []
    spill = 0
    for i in members:
        f = facts.faster.get(i, 1.0)
        for j, t in enumerate(facts.graph[i].outputs):
            v = (i, j)
            needed_later = facts.last_use.get(v, -1) > gi
            if v in facts.exported:
                writes.append(_faster(t.nbytes, f))
                outs.append(t)
            if not needed_later:
                continue
            if sbuf.fits(t.nbytes):
                sbuf.resident[v] = (gi, t.nbytes)
            elif v not in facts.exported:  # SBUF is full: the producer writes it out
                sbuf.spilled.add(v)
                spill += t.nbytes
                writes.append(_faster(t.nbytes, f))
                outs.append(t)
    return writes, outs, spill


def _keep_inputs(
    gi: int, members: list[int], loaded: set[Value], facts: GraphFacts, sbuf: Sbuf
) -> None:
    """A graph input that later groups read too stays in SBUF while it fits."""
    graph, alias = facts.graph, facts.alias
    for v in loaded:
        nbytes = next(t.nbytes for i in members for t, s in zip(graph[i].inputs, graph[i].sources,
                      strict=True) if s is not None and alias(s) == v)  # fmt: skip
        if facts.last_use.get(v, -1) > gi and v not in sbuf.spilled and sbuf.fits(nbytes):
            sbuf.resident[v] = (gi, nbytes)


_AFFINE = frozenset({"mul", "neg", "add", "sub", "rsub", "div"})


def _folds_into_activation(i: int, members: list[int], facts: GraphFacts) -> bool:
    """An affine op by a scalar whose one reader is the next op, a ScalarE activation, costs
    nothing: ScalarE computes func(x * scale + bias) in one instruction at the cost of func
    alone ([nki-arch]: "Instruction Combination"; neuronx-cc's silu is activation(exp,
    scale=-1), its AdamW activation(sqrt, scale=1000))."""
    graph, plans = facts.graph, facts.plans
    at = members.index(i)
    own = plans[i].computes
    if at + 1 == len(members) or len(own) != 1 or own[0].opcode != "tensor_scalar":
        return False
    if ops.base_name(graph[i].op) not in _AFFINE or any(graph[i].exported):
        return False
    nxt = plans[members[at + 1]].computes
    if len(nxt) != 1 or nxt[0].opcode != "activation" or nxt[0].engine != facts.spec.scalar.name:
        return False
    readers = [k for k, g in enumerate(graph) for src in g.sources
               if src is not None and facts.alias(src) == (i, 0)]  # fmt: skip
    return readers == [members[at + 1]]


def _faster(nbytes: int, factor: float) -> int:
    """An op's HBM bytes as a transfer `factor` times faster moves them (as many, unsped)."""
    return nbytes if factor == 1 else round(nbytes / factor)


def _place_tensor_scalar(
    spec: DeviceSpec, computes: list[Compute], factors: Sequence[float] = ()
) -> list[Compute]:
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
    for k, c in enumerate(computes):
        if movable(c):
            moved = _pass(spec, spec.scalar, "tensor_scalar", c.flops, c.sbuf_bytes // c.flops)
            f = factors[k] if k < len(factors) else 1.0
            if f != 1:  # a sped-up op's pass is as much faster on ScalarE
                moved = moved._replace(dur_ns=moved.dur_ns / f)
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

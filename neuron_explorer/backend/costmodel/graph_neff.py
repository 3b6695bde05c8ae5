"""A compiled graph's groups issued as one NEFF (costmodel/graph.py builds the groups).

The NEFF is one schedulable plan: each group's instructions keep their own dependencies, a
group's first compute also waits for the groups whose outputs it reads (their last compute when
the value stayed in SBUF, their stores when it spilled), its loads wait only for the earlier
group whose operands would overflow SBUF's staging share with theirs to start computing (DMA
prefetch of the next ops' operands under the current op's compute), and each group's stores are
issued after the next group's first loads.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from .plan import DMA, Instr, KernelPlan
from .spec import DeviceSpec


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


def assemble_neff(name, built, groups, spec: DeviceSpec) -> NeffPlan:
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

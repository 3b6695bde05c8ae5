"""`whatif --speedup 'aten::mm=2'` on compiled graphs: the op is inside fused groups, not a
kernel of its own. The graph each NEFF was lowered from (the profile's `graphs` table, as
`whatif --chip` reads it: chip_swap.py) is lowered twice, as captured and with the named op's
work in its groups (its engine passes and the HBM bytes it alone reads and writes) that many
times faster, and each group's kernel is scaled by the ratio of its two times. A group that
does not hold the op can move too, where the NEFF's overlap of it with a sped-up one changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import ExplorerError
from ..model.profile import Profile
from .chip_swap import groups_of, kept_graphs
from .depgraph import Graph


@dataclass(frozen=True)
class InGraphs:
    """What an op's speedup does to a step's compiled kernels."""

    durations: dict[int, int]  # event id -> new dur_ns, for the kernels whose time moves
    decided: frozenset[int]  # compiled kernels whose graph was lowered (not matched by name)
    kernels: int  # compiled kernels (fused groups) holding the op
    graphs: int  # compiled graphs holding the op


def op_in_graphs(
    graph: Graph, profile: Profile, wanted: Callable[[str], bool], factor: float, chip: str,
    base: Mapping[int, int],
) -> InGraphs:  # fmt: skip
    """The step's compiled kernels with every op `wanted` names sped up `factor` times in the
    groups of its graph, lowered for `chip`; `base` holds durations an earlier change set (a
    chip swap), which the ratio scales."""
    nodes = [n for n in graph.nodes if not n.host and n.kind == "device" and n.neff is not None]
    where = groups_of(profile, [n.event_id for n in nodes]) if graph.modeled and nodes else {}
    if not where:  # no compiled kernel: the backend (it imports torch: 3 s, 180 MB) not loaded
        return InGraphs({}, frozenset(), 0, 0)
    from ..backend.costmodel.graph_record import faster_times, undeclared_op

    durations: dict[int, int] = {}
    decided: set[int] = set()
    kernels = graphs = 0
    for key, ops in kept_graphs(profile, {k for k, _ in where.values()}).items():
        if undeclared_op(ops):
            continue  # this process cannot lower it as the capture did (chip_swap.py)
        mine = [n for n in nodes if n.event_id in where and where[n.event_id][0] == key]
        faster = {i: factor for i, g in enumerate(ops) if wanted(g.op)}
        if not faster:
            decided.update(n.event_id for n in mine)
            continue
        before, after, holding = faster_times(ops, _spec(profile, chip), faster)
        held = 0
        for n in mine:
            gi = where[n.event_id][1]
            if not 0 <= gi < len(before) or before[gi][0] != n.name:
                continue  # not this graph's kernel as recorded: left to the name match
            decided.add(n.event_id)
            held += gi in holding
            t_old, t_new = before[gi][1], after[gi][1]
            if t_new != t_old and t_old > 0:
                durations[n.event_id] = round(base.get(n.event_id, n.dur_ns) * t_new / t_old)
        kernels += held
        graphs += held > 0
    return InGraphs(durations, frozenset(decided), kernels, graphs)


def _spec(profile: Profile, chip: str):
    from ..backend.costmodel.spec import get_spec

    try:
        return get_spec(chip)
    except (KeyError, ValueError) as e:
        raise ExplorerError(f"{profile.path}: its compiled graphs' chip {chip!r}: {e}") from None

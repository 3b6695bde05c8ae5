"""What-if: a step replayed (replay.py) with changes a user names: ops, kernels or modules made
faster, the host's syncs removed, or the kernels lowered again for another chip (a neuron
capture keeps each kernel's op, shapes and dtypes, and the graph each compiled program was
lowered from, so the cost model can time them on trn1, trn2 or trn3: chip_swap.py). An op
named inside a compiled graph's fused groups is sped up there and the groups re-timed
(graph_speedup.py).
`neuron-explorer whatif` prints the result; the MCP tool `whatif` returns it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..errors import ExplorerError
from ..model.profile import Profile
from .chip_swap import chip_change
from .depgraph import COLLECTIVE_WAIT_NAMES, Graph, Node, build_graph
from .graph_speedup import InGraphs, op_in_graphs
from .page import PageModel
from .replay import Change, replay

GRAPH_OP = "neuron_graph_"  # a compiled graph's fused groups (backend/compiler.py)
FIELDS = ("op", "kernel", "module", "line")  # what a --speedup can name before '='


@dataclass(frozen=True)
class RankResult:
    rank: int
    before_ns: int
    after_ns: int


@dataclass(frozen=True)
class WhatIf(PageModel):
    """One step before and after the changes: its replayed length on every rank."""

    profile: str
    label: str
    changes: tuple[str, ...]
    before_ns: int  # the slowest rank's step, replayed as recorded
    after_ns: int
    saving_ns: int
    saving_share: float
    ranks: tuple[RankResult, ...]
    events_changed: int
    modeled: bool
    fused_kernels: int = 0  # compiled kernels (fused groups) an op's speedup reached inside


def parse_speedup(spec: str) -> tuple[str, str, float]:
    """'aten::mm=2' -> (op-or-kernel, aten::mm, 2.0); 'module=PATH:1.5' -> (module, PATH,
    1.5); likewise op=, kernel= and line=FILE:LINE:F."""
    head, eq, rest = spec.partition("=")
    if head in FIELDS and eq:
        target, colon, factor = rest.rpartition(":")
        field = head
    else:
        target, colon, factor = spec.rpartition("=")
        field = "name"
    if not target or not colon:
        raise ExplorerError(
            f"--speedup {spec!r}: write NAME=FACTOR (an op or kernel) or "
            "module=PATH:FACTOR, op=NAME:FACTOR, kernel=NAME:FACTOR, line=FILE:LINE:FACTOR"
        )
    try:
        f = float(factor)
    except ValueError:
        raise ExplorerError(f"--speedup {spec!r}: the factor {factor!r} is not a number") from None
    if not f > 0:
        raise ExplorerError(f"--speedup {spec!r}: the factor must be above 0")
    return field, target, f


def matcher(field: str, target: str) -> Callable[[Node], bool]:
    """Which device work a --speedup names."""
    if field == "module":
        return lambda n: (
            n.module is not None and (n.module == target or n.module.startswith(target + "."))
        )
    if field == "line":
        return lambda n: n.src is not None and (n.src == target or n.src.endswith("/" + target))
    if field == "kernel":
        return lambda n: n.name == target
    if field == "op":
        return lambda n: n.op_name == target
    return lambda n: target in (n.op_name, n.name)


def sync_change(graph: Graph) -> Change:
    """Every host call that waits for the device removed (not a collective's own wait)."""
    ids = frozenset(
        n.event_id
        for n in graph.nodes
        if n.host and n.kind == "sync" and n.name not in COLLECTIVE_WAIT_NAMES
        and not any(graph.nodes[d].kind == "collective"
                    for w in graph.windows.values() for d in w.launched.get(n.index, ()))
    )  # fmt: skip
    return Change(f"{len(ids)} host syncs removed", drop_syncs=ids)


def whatif(
    profile: Profile, speedups: Sequence[str] = (), drop_syncs: bool = False,
    chip: str | None = None, step: int | None = None, annotation: str | None = None,
    instance: int = 0,
) -> WhatIf:  # fmt: skip
    """One step (the median by default; or an annotation's instance) replayed with the named
    changes."""
    parsed = [parse_speedup(s) for s in speedups]
    graph = build_graph(profile, step, annotation, instance)
    change = Change()
    if chip:
        change = change + chip_change(graph, profile, chip)
    fused = 0
    for (field, target, factor), spec in zip(parsed, speedups, strict=True):
        part, inside = speedup_change(graph, profile, (field, target, factor), change, chip)
        if not part.durations and not (inside and inside.kernels):
            raise ExplorerError(f"--speedup {spec!r}: no device work of this step matches"
                                f"{_hint(graph, inside)}")  # fmt: skip
        change, fused = change + part, fused + (inside.kernels if inside else 0)
    if drop_syncs:
        change = change + sync_change(graph)
    return replace(result(graph, str(profile.path), change), fused_kernels=fused)


def speedup_change(
    graph: Graph, profile: Profile, speedup: tuple[str, str, float], base: Change,
    chip: str | None,
) -> tuple[Change, InGraphs | None]:  # fmt: skip
    """One --speedup as a change, and what it does inside compiled kernels (fused groups) for
    an op: an op (or a kernel's own name) inside a compiled graph is sped up in its groups
    (graph_speedup.py), any other device work it names is its whole time divided."""
    field, target, factor = speedup
    match = matcher(field, target)
    inside = None
    if field in ("name", "op"):

        def wanted(op: str) -> bool:  # asked only of compiled graphs' ops
            if field == "op":
                return op == target
            # here, not at the top: the backend imports torch (220 MB, 3 s), which every web
            # server would hold from its start for this one route, and a step without
            # compiled graphs does not need
            from ..backend.costmodel.ops import base_name

            return target in (op, base_name(op))

        inside = op_in_graphs(graph, profile, wanted, factor,
                              chip or profile.manifest.spec.name or "trn2", base.durations)  # fmt: skip
    decided = inside.decided if inside else frozenset()
    scaled = {n.event_id: base.durations.get(n.event_id, n.dur_ns) for n in graph.nodes
              if not n.host and n.event_id not in decided and match(n)}  # fmt: skip
    durations = {k: round(v / factor) for k, v in scaled.items()}
    what = f"{target} {factor:g}x faster ({len(scaled)} events)"
    if inside and inside.kernels:
        durations.update(inside.durations)
        fused = (f"inside {inside.kernels} fused kernels of {inside.graphs} compiled graphs, "
                 f"their NEFFs re-timed: {len(inside.durations)} kernels move")  # fmt: skip
        what = (f"{target} {factor:g}x faster ({len(scaled)} events; and {fused})" if scaled
                else f"{target} {factor:g}x faster {fused.replace(', ', ' (', 1)})")  # fmt: skip
    return Change(what, durations), inside


def _hint(graph: Graph, inside: InGraphs | None) -> str:
    compiled = sum(1 for n in graph.nodes if not n.host and (n.op_name or "").startswith(GRAPH_OP))
    if not compiled or inside is None:
        return ""
    lacking = compiled - len(inside.decided)
    if not lacking:
        return f", nor an op inside its {compiled} compiled-graph kernels"
    return (f" ({lacking} of its {compiled} compiled-graph kernels have no graph kept in the "
            "profile to find ops in: name a module=PATH or line=FILE:LINE instead)")  # fmt: skip


def result(graph: Graph, profile: str, change: Change) -> WhatIf:
    base, after = replay(graph), replay(graph, change)
    ranks = tuple(RankResult(r, base.step_ns[r], after.step_ns[r]) for r in sorted(base.step_ns))
    before = max(base.step_ns.values(), default=0)
    new = max(after.step_ns.values(), default=0)
    saving = before - new
    changes = tuple(c for c in change.what.split("; ") if c and c != "no change")
    n = len(change.durations) + len(change.drop_syncs)
    return WhatIf(profile, graph.label, changes, before, new, saving,
                  round(saving / before, 6) if before else 0.0, ranks, n, graph.modeled)  # fmt: skip

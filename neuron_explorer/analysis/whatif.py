"""What-if: a step replayed (replay.py) with changes a user names: ops, kernels or modules made
faster, the host's syncs removed, or the kernels lowered again for another chip (a neuron
capture keeps each kernel's op, shapes and dtypes, and the graph each compiled program was
lowered from, so the cost model can time them on trn1, trn2 or trn3: chip_swap.py).
`neuron-explorer whatif` prints the result; the MCP tool `whatif` returns it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ExplorerError
from ..model.profile import Profile
from .chip_swap import chip_change
from .depgraph import COLLECTIVE_WAIT_NAMES, Graph, Node, build_graph
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
    for (field, target, factor), spec in zip(parsed, speedups, strict=True):
        match = matcher(field, target)
        scaled = {n.event_id: change.durations.get(n.event_id, n.dur_ns) for n in graph.nodes
                  if not n.host and match(n)}  # fmt: skip
        if not scaled:
            graphs = sum(
                1 for n in graph.nodes if not n.host and (n.op_name or "").startswith(GRAPH_OP)
            )
            hint = (
                f" (its {graphs} compiled-graph kernels are fused groups, not aten ops: name a "
                "module=PATH or line=FILE:LINE instead)"
                if graphs and field in ("name", "op")
                else ""
            )
            raise ExplorerError(f"--speedup {spec!r}: no device work of this step matches{hint}")
        durations = {k: round(v / factor) for k, v in scaled.items()}
        change = change + Change(f"{target} {factor:g}x faster ({len(scaled)} events)", durations)
    if drop_syncs:
        change = change + sync_change(graph)
    return result(graph, str(profile.path), change)


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

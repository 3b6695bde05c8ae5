"""A finding's saving as a replay: a rule names its change as data (`Replayed`: which events,
and what happens to them), and the saving is how much the steps those events belong to get
shorter when replayed with it (replay.py), never more than those steps. The same replay of two
findings together tells whether their savings add (runner.py marks the ones that do not)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .depgraph import Graph, build_graph
from .replay import Change, Schedule, replay

if TYPE_CHECKING:
    from .context import AnalysisContext

ACTIONS = ("drop_syncs", "scale", "set", "set_each", "remove_host", "remove_spans")
MAX_STEPS = 12  # steps replayed per finding; with more, the touched steps are sampled evenly


@dataclass(frozen=True)
class Replayed:
    """A change, as data: `action` on the `ev` rows `where` selects.

    - drop_syncs: those host calls no longer wait for the device, nor cost;
    - scale: their durations divided by `factor`;
    - set: their durations become `dur_sql` (an SQL expression over their columns);
    - set_each: each event of `each` (event id, new dur_ns) gets its own new duration (a
      rule's per-event prediction: a matmul's bf16 time, a kernel without its small DMAs'
      setup); `where` is then ignored;
    - remove_host: host time removed: the first `factor` share of each selected span;
    - remove_spans: host time removed: each (rank, start_ns, end_ns) of `spans` (`where` is
      then ignored; the steps are those the spans start in).
    """

    what: str  # the change in words: "these 12 syncs removed"
    where: str  # an SQL condition over `ev`
    action: str  # one of ACTIONS
    factor: float = 1.0
    dur_sql: str | None = None
    each: tuple[tuple[int, int], ...] = ()
    then: tuple[Replayed, ...] = ()  # more changes made with this one (their `what` unsaid)
    spans: tuple[tuple[int, int, int], ...] = ()


_GRAPHS: weakref.WeakKeyDictionary[AnalysisContext, dict] = weakref.WeakKeyDictionary()
# what each finding replayed, for the runner's overlap check: (rule, title) -> (Change, steps)
CHANGES: weakref.WeakKeyDictionary[AnalysisContext, dict] = weakref.WeakKeyDictionary()


def _graph(ctx: AnalysisContext, step: int | None) -> tuple[Graph, int]:
    """The step's graph and its replayed length as recorded, built once per context."""
    cache = _GRAPHS.setdefault(ctx, {})
    if step not in cache:
        graph = build_graph(ctx.profile, step)
        cache[step] = (graph, max(replay(graph).step_ns.values(), default=0))
    return cache[step]


def change_of(ctx: AnalysisContext, rep: Replayed) -> tuple[Change, list[int | None]]:
    """The replay change `rep` names (with its `then` changes), and the steps its events
    belong to."""
    change, steps = _change_of(ctx, rep)
    for more in rep.then:
        c, s = change_of(ctx, more)
        change = change + c
        steps = sorted(set(steps) | set(s), key=lambda x: -1 if x is None else x)
    return Change(rep.what, change.durations, change.drop_syncs, change.drop_host), steps


def _change_of(ctx: AnalysisContext, rep: Replayed) -> tuple[Change, list[int | None]]:
    if rep.action == "remove_spans":
        return Change(rep.what, drop_host=rep.spans), _steps_of(ctx, rep.spans)
    if rep.action == "remove_host":
        return _removed_host(ctx, rep)
    new = f", ({rep.dur_sql}) AS new_ns" if rep.dur_sql else ""
    where = rep.where
    if rep.action == "set_each":
        where = f"id IN ({', '.join(str(int(i)) for i, _ in rep.each) or 'NULL'})"
    rows = ctx.rows(f"SELECT id, rank, step, start_ns, dur_ns{new} FROM ev WHERE {where}")
    steps = sorted({r["step"] for r in rows}, key=lambda s: -1 if s is None else s)
    ids = [int(r["id"]) for r in rows]
    if rep.action == "drop_syncs":
        return Change(rep.what, drop_syncs=frozenset(ids)), steps
    if rep.action == "scale":
        return Change(rep.what, {i: round(int(r["dur_ns"]) / rep.factor)
                                 for i, r in zip(ids, rows, strict=True)}), steps  # fmt: skip
    if rep.action == "set":
        return Change(rep.what, {i: max(int(r["new_ns"] or 0), 0)
                                 for i, r in zip(ids, rows, strict=True)}), steps  # fmt: skip
    if rep.action == "set_each":
        each = {int(i): max(int(ns), 0) for i, ns in rep.each}
        return Change(rep.what, {i: each[i] for i in ids}), steps
    raise ValueError(f"unknown replay action {rep.action!r}")


def _removed_host(ctx: AnalysisContext, rep: Replayed) -> tuple[Change, list[int | None]]:
    """remove_host's change: the first `factor` share of each selected span, by columns
    (launch-bound selects every dispatched op: 443,110 on the 10 GB trace's excerpt, whose
    rows as dicts and tuples one by one took 1.5 s of CPU). np.rint rounds half to even as
    round() does, so the spans are the same integers."""
    import numpy as np

    t = ctx.arrow(f"SELECT rank, step, start_ns, dur_ns FROM ev WHERE {rep.where}")
    start = t["start_ns"].to_numpy().astype(np.int64)
    cut = np.rint(t["dur_ns"].to_numpy().astype(np.int64) * rep.factor).astype(np.int64)
    spans = tuple(zip(t["rank"].to_pylist(), start.tolist(), (start + cut).tolist(), strict=True))
    steps = sorted(set(t["step"].to_pylist()), key=lambda s: -1 if s is None else s)
    return Change(rep.what, drop_host=spans), steps


def _steps_of(ctx: AnalysisContext, spans: tuple[tuple[int, int, int], ...]) -> list[int | None]:
    """The steps the spans start in (None: outside every step)."""
    wins = ctx.profile.manifest.steps
    if not wins:
        return [None] if spans else []
    found: set[int | None] = {w.step for r, s, _ in spans for w in wins
                              if w.rank == r and w.start_ns <= s < w.start_ns + w.dur_ns}  # fmt: skip
    return sorted(found, key=lambda x: -1 if x is None else x)


def saving(ctx: AnalysisContext, change: Change, steps: list[int | None]) -> int:
    """How much shorter the steps get with `change`, summed over `steps` (sampled evenly when
    there are more than MAX_STEPS, and scaled up to all of them)."""
    if not steps:
        return 0
    known = {s.step for s in ctx.profile.manifest.steps}
    steps = [s for s in steps if s in known] if known else [None]
    if not steps:
        return 0
    picked = steps if len(steps) <= MAX_STEPS else steps[:: -(-len(steps) // MAX_STEPS)]
    total = 0
    for s in picked:
        graph, base = _graph(ctx, s)
        after = max(replay(graph, change).step_ns.values(), default=0)
        total += min(max(base - after, 0), base)
    return round(total * len(steps) / len(picked))


def replay_saving(ctx: AnalysisContext, rep: Replayed, key: tuple[str, str]) -> int:
    """The saving of `rep` (remembered under `key` for the overlap check)."""
    change, steps = change_of(ctx, rep)
    CHANGES.setdefault(ctx, {})[key] = (change, steps)
    return saving(ctx, change, steps)


def joint_saving(ctx: AnalysisContext, *keys: tuple[str, str]) -> int | None:
    """The saving of several findings' changes replayed together (None: one did not replay):
    never more than the steps they touch, whatever their own savings add up to."""
    known = CHANGES.get(ctx, {})
    if not keys or any(k not in known for k in keys):
        return None
    change, steps = known[keys[0]][0], set(known[keys[0]][1])
    for k in keys[1:]:
        other = known[k][0]
        # two fixes of one event (fused, and in bf16): the shorter of the two, not compounded
        both = {i: min(d, change.durations[i]) for i, d in other.durations.items()
                if i in change.durations}  # fmt: skip
        change = change + other + Change(change.what, both)
        steps |= set(known[k][1])
    return saving(ctx, change, sorted(steps, key=lambda s: -1 if s is None else s))


def waits_cut(ctx: AnalysisContext, key: tuple[str, str]) -> int:
    """How much less the ranks wait at collectives (for their last rank to arrive) when the
    finding `key`'s change is replayed, over its steps as saving() takes them: time that a
    bound on those waits (a straggler's, a slow collective's) counts too."""
    known = CHANGES.get(ctx, {})
    if key not in known:
        return 0
    change, steps = known[key]
    have = {s.step for s in ctx.profile.manifest.steps}
    steps = [s for s in steps if s in have] if have else [None]
    if not steps:
        return 0
    picked = steps if len(steps) <= MAX_STEPS else steps[:: -(-len(steps) // MAX_STEPS)]
    total = 0
    for s in picked:
        graph, _ = _graph(ctx, s)
        total += _waits(replay(graph)) - _waits(replay(graph, change))
    return max(round(total * len(steps) / len(picked)), 0)


def _waits(sched: Schedule) -> int:
    """The replayed collectives' waits: from each rank's arrival to the transfer's start."""
    return sum(max(begin - sched.arrival.get(d, begin), 0) for d, (begin, _) in sched.begin.items())

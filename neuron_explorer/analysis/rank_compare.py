"""Two ranks of one job side by side: each rank of a job's profile read as a profile of its own
(model.combine.rank_view), compared as two profiles are (analysis/compare.py), plus what only a
pair of ranks has: each collective matched across the two ranks, with each rank's wait (for the
last rank to arrive) and transfer. `neuron-explorer diff JOB@rank=0 JOB@rank=1` prints the
comparison; the web's ranks page (/p/NAME/ranks?a=&b=) shows `rank_pair`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..model.combine import rank_view
from ..model.profile import Profile
from .collectives import WAIT_DEFINITION, Collective, collectives, rank_step_waits
from .compare import Comparison, diff
from .context import context
from .page import PageModel, is_modeled

TOP_CALLS = 500  # collectives matched across the ranks sent, largest wait difference first


def open_side(spec: str) -> tuple[Profile, str]:
    """A profile directory, or `DIR@rank=N` for one rank of a job's profile (read in place),
    with the name to show for it; a BadInputError names the directory or the missing rank."""
    base, sep, rank = spec.rpartition("@rank=")
    if sep and rank.isdigit() and not Path(spec).is_dir():
        return rank_view(Profile.open(base), int(rank)), spec
    return Profile.open(spec), spec


def compare_ranks(profile: Profile, a: int, b: int) -> Comparison:
    """Rank `b` of a job's profile against rank `a`, side by side: the compare page's document
    (step time, breakdown, ops, kernels, lines, modules, findings) of the two ranks."""
    return diff(rank_view(profile, a), rank_view(profile, b),
                f"{profile.name}@rank={a}", f"{profile.name}@rank={b}")  # fmt: skip


@dataclass(frozen=True)
class CollectiveTotals:
    """One rank's collectives of one name: how many, their bytes, wait and transfer."""

    calls: int = 0
    bytes: int = 0
    wait_ns: int = 0
    transfer_ns: int = 0


@dataclass(frozen=True)
class CollectiveKind:
    name: str
    a: CollectiveTotals
    b: CollectiveTotals


@dataclass(frozen=True)
class CallSide:
    """One rank's side of one collective: its device event, when it started, its split."""

    id: int
    start_ns: int
    wait_ns: int
    transfer_ns: int


@dataclass(frozen=True)
class CollectiveCall:
    """One collective as both ranks ran it, matched by its group and number (the same on every
    rank of a neuron capture), else by its name and order; a side is None where that rank has
    no such collective."""

    match: str
    name: str
    step: int | None
    bytes: int
    a: CallSide | None
    b: CallSide | None


@dataclass(frozen=True)
class RankPair(PageModel):
    """Rank `b` of a job against rank `a`: `comparison` is `compare_ranks` (steps with each
    rank's step windows on the job's one clock, ops, kernels, lines, modules, findings);
    `collectives` totals each collective name per rank, wait apart from transfer; `calls` are
    single collectives matched across the two ranks (at most TOP_CALLS, the largest
    difference in wait first; `calls_total` counts them all)."""

    profile: str
    ranks: tuple[int, ...]
    a: int
    b: int
    collectives: tuple[CollectiveKind, ...]
    calls: tuple[CollectiveCall, ...]
    calls_total: int
    comparison: Comparison
    device_time_modeled: bool


@dataclass(frozen=True)
class RankTime:
    """One rank's recorded steps split into its own work (`busy_ns`: the steps' time less the
    wait) and the time it waited for the other ranks (`wait_ns`, collectives.WAIT_DEFINITION)."""

    rank: int
    steps: int
    step_ns: int
    busy_ns: int
    wait_ns: int


@dataclass(frozen=True)
class RankTimes(PageModel):
    """Every rank's busy and wait time over its steps, with the definition of the wait."""

    ranks: tuple[RankTime, ...]
    wait_definition: str


def rank_times(profile: Profile) -> RankTimes:
    """Each rank's steps, busy and wait time (no rank without recorded steps)."""
    ctx = context(profile)
    with ctx.lock:
        per_rank = rank_step_waits(ctx)
    rows = tuple(
        RankTime(
            rank=rank,
            steps=len(steps),
            step_ns=sum(s.dur_ns for s in steps),
            busy_ns=sum(s.busy_ns for s in steps),
            wait_ns=sum(s.wait_ns for s in steps),
        )
        for rank, steps in sorted(per_rank.items())
    )
    return RankTimes(rows, WAIT_DEFINITION)


def default_pair(profile: Profile) -> tuple[int, int]:
    """The two ranks to show first: the one that waited longest for the others (`rank_times`'
    wait; without steps, the sum of its collectives' waits) against the one that waited least
    (the one they waited for: a straggler); the first two ranks when no rank waited. A profile
    of fewer than two ranks has no pair (ValueError)."""
    ranks = list(profile.manifest.ranks)
    if len(ranks) < 2:
        raise ValueError(f"{profile.name} holds {len(ranks)} rank")
    waits = dict.fromkeys(ranks, 0)
    times = rank_times(profile).ranks
    if times:
        waits.update({t.rank: t.wait_ns for t in times})
    else:
        ctx = context(profile)
        with ctx.lock:
            for c in collectives(ctx):
                waits[c.rank] = waits.get(c.rank, 0) + c.wait_ns
    most = max(ranks, key=lambda r: (waits[r], -r))
    least = min(ranks, key=lambda r: (waits[r], r))
    if most == least or waits[most] == 0:
        return ranks[0], ranks[1]
    return most, least


def rank_pair(profile: Profile, a: int, b: int, comparison: Comparison | None = None) -> RankPair:
    """Ranks `a` and `b` of a job's profile side by side (`comparison`: compare_ranks's, when
    the caller has it); a BadInputError names the profile if it lacks either rank."""
    rank_view(profile, a), rank_view(profile, b)  # the one check of both ranks
    ctx = context(profile)
    with ctx.lock:
        both = [c for c in collectives(ctx) if c.rank in (a, b)]
    calls = _matched(both, a, b)
    calls.sort(key=lambda c: (-abs(_wait(c.a) - _wait(c.b)), c.match))
    return RankPair(
        profile=profile.name,
        ranks=tuple(profile.manifest.ranks),
        a=a,
        b=b,
        collectives=_totals(both, a, b),
        calls=tuple(calls[:TOP_CALLS]),
        calls_total=len(calls),
        comparison=comparison if comparison is not None else compare_ranks(profile, a, b),
        device_time_modeled=is_modeled(profile),
    )


def _wait(side: CallSide | None) -> int:
    return side.wait_ns if side is not None else 0


def _totals(both: list[Collective], a: int, b: int) -> tuple[CollectiveKind, ...]:
    sums: dict[tuple[str, int], list[int]] = {}
    for c in both:
        s = sums.setdefault((c.name, c.rank), [0, 0, 0, 0])
        s[0], s[1], s[2], s[3] = s[0] + 1, s[1] + c.bytes, s[2] + c.wait_ns, s[3] + c.transfer_ns
    totals = {k: CollectiveTotals(*v) for k, v in sums.items()}
    none = CollectiveTotals()
    kinds = [CollectiveKind(n, totals.get((n, a), none), totals.get((n, b), none))
             for n in {n for n, _ in sums}]  # fmt: skip
    # the most time in collectives first (wait and transfer, both ranks)
    busy = lambda k: k.a.wait_ns + k.a.transfer_ns + k.b.wait_ns + k.b.transfer_ns  # noqa: E731
    return tuple(sorted(kinds, key=lambda k: (-busy(k), k.name)))


def _matched(both: list[Collective], a: int, b: int) -> list[CollectiveCall]:
    """Each collective of the two ranks keyed by its group and number where recorded, else by
    its name and its order among that rank's collectives of the name."""
    seen: dict[tuple[int, str], int] = {}
    keyed: dict[str, dict[int, Collective]] = {}
    for c in both:  # in rank, start order
        if c.match:
            key = c.match
        else:
            n = seen[(c.rank, c.name)] = seen.get((c.rank, c.name), -1) + 1
            key = f"{c.name}#{n}"
        keyed.setdefault(key, {})[c.rank] = c
    out = []
    for key, sides in keyed.items():
        first = sides.get(a) or sides[b]
        out.append(CollectiveCall(key, first.name, first.step, first.bytes,
                                  _side(sides.get(a)), _side(sides.get(b))))  # fmt: skip
    return out


def _side(c: Collective | None) -> CallSide | None:
    return None if c is None else CallSide(c.id, c.start_ns, c.wait_ns, c.transfer_ns)

"""straggler: one rank's steps are slower than the others', and every other rank waits for it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..collectives import RankStep, rank_step_waits
from ..context import AnalysisContext
from ..findings import Evidence, Hotspot
from ..rule import Draft, Rule, fmt_ms

BOUND = (
    "the job at the pace of its other ranks (the straggler's median extra a step); not "
    "replayed: what the slow rank does more is spread over its step, not a set of events to "
    "remove"
)


@dataclass(frozen=True)
class RankWork:
    """Each rank's steps (ranks with MIN_STEPS or more) and its median busy time per step."""

    ranks: dict[int, list[RankStep]]
    busy: dict[int, float]

    def others_median(self, rank: int) -> float:
        return statistics.median(self.busy[o] for o in self.busy if o != rank)


class Straggler(Rule[RankWork]):
    """A rank whose own work per step is slower than the other ranks', so they wait for it.

    Pattern: in data-parallel training every rank meets the others at each gradient all-reduce;
    a rank with more work (a bigger batch, a slow data loader, extra logging, a throttled chip)
    arrives last, and every other rank's collective turns into waiting.
    Algorithm: over the steady steps (a job's first step of each rank left out: it holds the
    ranks' start-up skew), per rank and step, busy time = step time minus the time the rank
    waited for the others (analysis/collectives.py: the time its host was blocked while one of
    its collectives waited for the last rank, the union of both, never a sum; on other traces
    the union of the collective kernels, an upper bound). Point-to-point waits are left out: a
    pipeline stage waiting for its neighbour is pipeline-bubbles' finding, whose advice fits. A
    rank whose host never blocks on its collectives (FSDP2) waits for nobody however late its
    device starts them. A rank is a straggler when, in at least MIN_STEP_SHARE of the steps, its
    busy time is at least STEP_EXTRA_NS above the median busy time of the other ranks in the
    same step while they wait at least half of that for the last rank (they pay for it: a host
    hiccup on a rank whose peers never block on it is no straggler) and it is that last rank (it
    waits no more than the least waiting other rank, within half of STEP_EXTRA_NS: a rank that
    lost its host early in a step, then waited for a slower one, held nobody up), and over the
    steps its busy time less theirs, step by step, is at least MIN_EXTRA_NS in the median
    (paired: another rank's host hiccups in some steps do not hide it) and its median busy time
    RATIO times theirs: a rank that is slower step after step, not one that lost the CPU once.
    Needs at least two ranks with MIN_STEPS steady steps each. The saving is that median extra
    per step over the judged steps: the job runs at its slowest rank's pace.
    """

    id = "straggler"
    title = "Straggler rank"
    severity = "high"
    RATIO = 1.05
    MIN_STEP_SHARE = 0.6  # 2 of the 3 steps a default capture records
    MIN_EXTRA_NS = 1_000_000
    STEP_EXTRA_NS = 500_000
    MIN_STEPS = 2
    fix = (
        "Find what the slow rank does that the others do not (open its steps beside another "
        "rank's in the timeline): give every rank the same amount of data (drop_last=True, "
        "equal shards), move per-rank logging, checkpointing and evaluation off the step path or "
        "onto every rank at once, and check that the rank's data loader keeps up."
    )

    def measure(self, ctx: AnalysisContext) -> RankWork | None:
        # a pipeline stage waiting for its neighbour is pipeline-bubbles' (stage imbalance)
        per_rank = rank_step_waits(ctx, steady=True, p2p=False)
        ranks = {r: v for r, v in per_rank.items() if len(v) >= self.MIN_STEPS}
        if len(ranks) < 2:
            return None
        busy = {r: statistics.median(s.busy_ns for s in v) for r, v in ranks.items()}
        return RankWork(ranks, busy)

    def stragglers(self, facts: RankWork) -> list[int]:
        """The straggler ranks, the busiest first."""
        out = []
        for rank, b in sorted(facts.busy.items(), key=lambda kv: -kv[1]):
            if b < self.RATIO * facts.others_median(rank):
                continue
            share, extra = _steps_judged(rank, facts.ranks, self.STEP_EXTRA_NS)
            if share >= self.MIN_STEP_SHARE and extra >= self.MIN_EXTRA_NS:
                out.append(rank)
        return out

    def gate(self, facts: RankWork) -> bool:
        return bool(self.stragglers(facts))

    def explain(self, facts: RankWork, evidence: Evidence) -> list[Draft]:
        return [self._explain_rank(facts, rank) for rank in self.stragglers(facts)]

    def _explain_rank(self, facts: RankWork, rank: int) -> Draft:
        ranks, busy = facts.ranks, facts.busy
        b, ref = busy[rank], facts.others_median(rank)
        steps = {s.step for s in ranks[rank]}
        waits = {
            o: sum(s.wait_ns for s in v if s.step in steps) for o, v in ranks.items() if o != rank
        }
        saving = _steps_judged(rank, ranks, self.STEP_EXTRA_NS)[1] * len(steps)
        return Draft(
            # the others' busy time is 0 where a rank's whole step was waiting for this one
            title=f"Rank {rank} is a straggler: "
            + (f"{b / ref:.2f}x the other ranks' step work" if ref else "the others only wait"),
            detail=(
                f"Rank {rank} needs {fmt_ms(b)} of its own work per step (median), the "
                f"other {len(busy) - 1} rank(s) {fmt_ms(ref)}, over {len(steps)} steady "
                f"step(s); they wait {fmt_ms(sum(waits.values()) / len(waits))} each for the "
                "last rank in collectives (time their host was blocked while a collective "
                "waited)."
            ),
            saving_ns=saving,
            bound=BOUND,
            evidence=Evidence(
                ops=tuple(
                    Hotspot(
                        label=f"rank {o}",
                        dur_ns=int(busy[o]),
                        count=len(ranks[o]),
                        note=f"waits {fmt_ms(waits.get(o, 0))}" if o != rank else "straggler",
                    )
                    for o in sorted(busy)
                ),
                metrics={
                    "rank": rank,
                    "busy_ns": int(b),
                    "others_busy_ns": int(ref),
                    "ratio": round(b / ref, 3) if ref else -1.0,
                    "others_wait_ns": int(sum(waits.values()) / len(waits)),
                },
            ),
        )


def _steps_judged(rank: int, ranks: dict, extra_ns: int) -> tuple[float, float]:
    """Over the steps `rank` shares with other ranks: the share in which it is busy at least
    `extra_ns` more than the other ranks' median busy time in the same step while they wait at
    least half of that for the last rank, and it is the last (slower, and the others pay for
    it); and the median of its busy time less theirs, step by step (paired, so another rank's
    host hiccups in some steps do not hide it)."""
    by_step: dict[int, dict[int, RankStep]] = {}
    for r, steps in ranks.items():
        for s in steps:
            by_step.setdefault(s.step, {})[r] = s
    aheads: list[float] = []
    slow = 0
    for step in by_step.values():
        others = [v for r, v in step.items() if r != rank]
        if rank not in step or not others:
            continue
        ahead = step[rank].busy_ns - statistics.median(o.busy_ns for o in others)
        aheads.append(ahead)
        waited = statistics.median(o.wait_ns for o in others)
        # the last to arrive: it waited no longer than the least waiting other rank (within
        # half the extra); a rank that itself waited for someone was not the one they waited
        # for, whatever its busy time (a host that lost its CPU early in the step)
        last = step[rank].wait_ns <= min(o.wait_ns for o in others) + extra_ns / 2
        slow += ahead >= extra_ns and waited >= extra_ns / 2 and last
    if not aheads:
        return 0.0, 0.0
    return slow / len(aheads), statistics.median(aheads)

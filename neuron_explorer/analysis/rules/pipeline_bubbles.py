"""pipeline-bubbles: pipeline stages with unequal work, so the lighter ones wait to receive."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..collectives import P2P, collectives, rank_step_waits, with_blocked
from ..context import AnalysisContext
from ..findings import Evidence, Hotspot
from ..rule import Draft, Rule, fmt_ms

BOUND = (
    "the busiest stage at the mean stage's busy time (stages balanced exactly); not replayed: "
    "moving layers moves work between ranks, and a replay re-times each rank's own events"
)


@dataclass(frozen=True)
class Stage:
    """One pipeline rank over its steps: its own work and its wait to receive, per step."""

    rank: int
    steps: int
    busy_ns: float  # median over its steps of step time minus its collective waits
    bubble_ns: float  # median over its steps of its point-to-point wait
    bubble_share: float  # median over its steps of that wait over the step time
    busy_by_step: dict[int, int]


@dataclass(frozen=True)
class Stages:
    stages: tuple[Stage, ...]  # the busiest first

    @property
    def ratio(self) -> float:
        low = self.stages[-1].busy_ns
        return self.stages[0].busy_ns / low if low > 0 else float("inf")

    def saving_ns(self) -> float:
        """Per common step, the busiest stage's work above the mean stage's, summed: what each
        step would lose if the work were spread evenly over the stages."""
        common = set.intersection(*(set(s.busy_by_step) for s in self.stages))
        total = 0.0
        for step in common:
            work = [s.busy_by_step[step] for s in self.stages]
            total += max(work) - statistics.mean(work)
        return total


class PipelineBubbles(Rule[Stages]):
    """Pipeline stages with unequal work: the lighter stages sit in bubbles, waiting to receive.

    Pattern: in pipeline parallelism (torch.distributed.pipelining) each rank runs one stage and
    passes activations and their gradients to its neighbours by send and receive. A schedule
    (GPipe, 1F1B) has fill and drain bubbles even with equal stages; when one stage holds more
    layers or heavier ones, every other stage also waits for it in each micro-batch, and the
    step runs at the pace of the slowest stage.
    Algorithm: only profiles with point-to-point collectives (neuron captures record each
    receive's wait for its sender). Per rank and steady step (a job's first step of each rank
    holds the ranks' start-up skew and is left out): busy time = step time minus the time the
    rank waited for the others (analysis/collectives.py: its host blocked while a collective
    waited), bubble = the part of that wait at point-to-point receives. Fires when the least
    busy stage spends at least MIN_BUBBLE_SHARE of its steps waiting to receive (median over
    the steps; a balanced 2-stage GPipe of 4 micro-batches waits about 1/5 in fill and drain),
    and the busiest stage's median busy time is at least RATIO times the least busy stage's and
    at least MIN_EXTRA_NS above the mean stage's (the host work every stage repeats, the
    schedule's own and the loss, keeps a 3:1 split of the layers near 2x in busy time; an even
    split by layer count, whose last stage also runs the loss, comes near 1.5x). Needs
    MIN_STEPS steps on at least two ranks. The saving is, per step, the busiest stage's busy
    time above the mean stage's: what balancing the stages gives back. A data-parallel or FSDP
    rank with more work than the others is the straggler rule's.
    """

    id = "pipeline-bubbles"
    title = "Pipeline stages unbalanced"
    severity = "high"
    RATIO = 1.75
    MIN_EXTRA_NS = 1_000_000
    MIN_BUBBLE_SHARE = 0.35
    MIN_STEPS = 2
    fix = (
        "Balance the stages by measured time, not by layer count: move layers from the busiest "
        "stage to the idle ones (the split points of torch.distributed.pipelining's pipeline() or "
        "the modules each PipelineStage holds; the loss and the optimizer step count too), then "
        "shrink the remaining fill/drain bubbles with more micro-batches (n_microbatches) or an "
        "interleaved schedule (ScheduleInterleaved1F1B, ScheduleLoopedBFS)."
    )

    def measure(self, ctx: AnalysisContext) -> Stages | None:
        bubbles: dict[tuple[int, int | None], int] = {}
        p2p = [c for c in collectives(ctx) if c.name == P2P and c.step is not None]
        for c in with_blocked(ctx, p2p):
            key = (c.rank, c.step)
            bubbles[key] = bubbles.get(key, 0) + (c.total_ns - c.transfer_ns)
        if not p2p:
            return None
        stages = []
        for rank, steps in rank_step_waits(ctx, steady=True).items():
            if len(steps) < self.MIN_STEPS:
                continue
            waits = [bubbles.get((rank, s.step), 0) for s in steps]
            stages.append(
                Stage(
                    rank=rank,
                    steps=len(steps),
                    busy_ns=statistics.median(s.busy_ns for s in steps),
                    bubble_ns=statistics.median(waits),
                    bubble_share=statistics.median(
                        w / s.dur_ns if s.dur_ns else 0.0 for w, s in zip(waits, steps, strict=True)
                    ),
                    busy_by_step={s.step: s.busy_ns for s in steps},
                )
            )
        if len(stages) < 2:
            return None
        return Stages(tuple(sorted(stages, key=lambda s: -s.busy_ns)))

    def gate(self, facts: Stages) -> bool:
        busiest, idlest = facts.stages[0], facts.stages[-1]
        mean = statistics.mean(s.busy_ns for s in facts.stages)
        return (
            facts.ratio >= self.RATIO
            and busiest.busy_ns - mean >= self.MIN_EXTRA_NS
            and idlest.bubble_share >= self.MIN_BUBBLE_SHARE
        )

    def explain(self, facts: Stages, evidence: Evidence) -> Draft:
        busiest, idlest = facts.stages[0], facts.stages[-1]
        saving = facts.saving_ns()
        return Draft(
            title=(
                f"Pipeline stages unbalanced: rank {busiest.rank} works {facts.ratio:.1f}x "
                f"longer per step than rank {idlest.rank}"
            ),
            detail=(
                f"Rank {busiest.rank}'s stage needs {fmt_ms(busiest.busy_ns)} of its own work "
                f"per step (median), rank {idlest.rank}'s {fmt_ms(idlest.busy_ns)}; rank "
                f"{idlest.rank} spends {idlest.bubble_share:.0%} of its steps "
                f"({fmt_ms(idlest.bubble_ns)}) waiting to receive from its neighbour. Spreading "
                f"the work evenly over the {len(facts.stages)} stages would save about "
                f"{fmt_ms(saving)} over the {busiest.steps} steps."
            ),
            saving_ns=saving,
            bound=BOUND,
            evidence=Evidence(
                ops=tuple(
                    Hotspot(
                        label=f"rank {s.rank}",
                        dur_ns=int(s.busy_ns),
                        count=s.steps,
                        note=f"waits to receive {fmt_ms(s.bubble_ns)} a step "
                        f"({s.bubble_share:.0%})",
                    )
                    for s in sorted(facts.stages, key=lambda s: s.rank)
                ),
                metrics={
                    "busiest_rank": busiest.rank,
                    "idlest_rank": idlest.rank,
                    "ratio": round(facts.ratio, 3),
                    "bubble_share": round(idlest.bubble_share, 4),
                },
            ),
        )

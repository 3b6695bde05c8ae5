"""Step statistics, computed by one function for every page: the summary (over its per-step
table), the profile list, the summary page and the comparison (over the manifest's steps)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..model.profile import Profile
from .page import PageModel

# a last step under this share of the shortest of the rank's others is partial (of their median,
# the step after a recompile would be: the compile step pulls the median of two up)
PARTIAL_STEP_SHARE = 0.5


@dataclass(frozen=True)
class StepTime:
    step: int | None
    rank: int
    start_ns: int
    dur_ns: int


@dataclass(frozen=True)
class StepStats(PageModel):
    """The profiled steps: how many, their total, mean, median, min and max time, each step,
    and which last steps look cut short."""

    count: int
    total_ns: int
    mean_ns: float
    median_ns: float
    min_ns: int
    max_ns: int
    # (rank, step) of last steps that look cut short: under PARTIAL_STEP_SHARE of the shortest
    # of the rank's other steps (torch.profiler closes the last ProfilerStep when it stops, so
    # a loop that calls prof.step() at the end leaves a stub step after it). Counted as recorded.
    partial_last_steps: tuple[tuple[int, int | None], ...] = ()
    per_step: tuple[StepTime, ...] = ()
    # (rank, step) left out of mean, median, min and max: in a job of several ranks, each
    # rank's first step (facts.steady_w), which holds the ranks' start-up skew
    left_out: tuple[tuple[int, int | None], ...] = ()
    startup_skew_ns: int = 0  # how far apart the ranks' first steps started


def step_stats(steps: Iterable[StepTime], job: bool | None = None) -> StepStats | None:
    """The statistics of `steps` (in rank, start order), None without any. In a job (`job`, by
    default: steps of several ranks) mean, median, min and max are steady-state figures: each
    rank's first step is left out where the rank has more (`left_out`, `startup_skew_ns`)."""
    rows = tuple(steps)
    if not rows:
        return None
    firsts: dict[int, StepTime] = {}
    counts: dict[int, int] = {}
    for r in rows:
        counts[r.rank] = counts.get(r.rank, 0) + 1
        if r.rank not in firsts or r.start_ns < firsts[r.rank].start_ns:
            firsts[r.rank] = r
    if job is None:
        job = len(firsts) > 1
    skipped = {id(f) for rank, f in firsts.items() if job and counts[rank] > 1}
    steady = [r for r in rows if id(r) not in skipped]
    starts = [f.start_ns for f in firsts.values()]
    d = np.array([r.dur_ns for r in steady], dtype=np.int64)
    return StepStats(
        count=len(rows),
        total_ns=int(sum(r.dur_ns for r in rows)),
        mean_ns=float(d.mean()),
        median_ns=float(np.median(d)),
        min_ns=int(d.min()),
        max_ns=int(d.max()),
        partial_last_steps=_partial_last_steps(rows),
        per_step=rows,
        left_out=tuple((f.rank, f.step) for f in firsts.values() if id(f) in skipped),
        startup_skew_ns=int(max(starts) - min(starts)) if job else 0,
    )


def profile_steps(profile: Profile) -> StepStats | None:
    """The step statistics of the steps the manifest lists (no table is read)."""
    return step_stats(
        StepTime(s.step, s.rank, s.start_ns, s.dur_ns) for s in profile.manifest.steps
    )


def partial_last_steps(rows: Iterable[StepTime]) -> tuple[tuple[int, int | None], ...]:
    """(rank, step) of each rank's last step where the profiler stopped inside it."""
    return _partial_last_steps(tuple(rows))


def _partial_last_steps(rows: tuple[StepTime, ...]) -> tuple[tuple[int, int | None], ...]:
    """The last step of each rank with 2+ steps when it is under PARTIAL_STEP_SHARE of the
    shortest of the rank's other steps."""
    out = []
    by_rank: dict[int, list[StepTime]] = {}
    for r in rows:
        by_rank.setdefault(r.rank, []).append(r)
    for rank in sorted(by_rank):
        mine = sorted(by_rank[rank], key=lambda r: r.start_ns)
        if len(mine) < 2:
            continue
        others = min(r.dur_ns for r in mine[:-1])
        if mine[-1].dur_ns < PARTIAL_STEP_SHARE * others:
            out.append((int(rank), mine[-1].step))
    return tuple(out)


@dataclass(frozen=True)
class JobSteps(PageModel):
    """The steps as the job ran them, the one step time `diff` and its gate compare: a step of
    a job of several ranks is as long as its slowest rank (one rank: the step itself), and a
    step that a rank's recording cut short (`partial_last_steps`) is left out. Each rank's
    first step counts (a median is not moved by one start-up step)."""

    count: int  # whole steps
    ranks: int
    median_ns: float
    per_step: tuple[tuple[int | None, int, int], ...]  # (step, its slowest rank, dur_ns)
    cut_short: tuple[int | None, ...] = ()  # steps left out: cut short on some rank

    @property
    def median_step(self) -> tuple[int | None, int]:
        """(step, rank) of the step whose time is the median (the lower of the two middle)."""
        row = sorted(self.per_step, key=lambda r: r[2])[(len(self.per_step) - 1) // 2]
        return row[0], row[1]


def job_steps(stats: StepStats | None) -> JobSteps | None:
    """Each whole step's slowest rank, in step order (None without steps)."""
    if stats is None:
        return None
    partial = set(stats.partial_last_steps)
    cut = {step for _, step in partial if step is not None}
    worst: dict[int | None, tuple[int, int]] = {}
    for s in stats.per_step:
        if (s.rank, s.step) in partial or s.step in cut:
            continue
        if s.step not in worst or s.dur_ns > worst[s.step][1]:
            worst[s.step] = (s.rank, s.dur_ns)
    if not worst:
        return None
    rows = tuple((k, *worst[k]) for k in sorted(worst, key=lambda k: -1 if k is None else k))
    return JobSteps(len(rows), len({s.rank for s in stats.per_step}),
                    float(np.median([r[2] for r in rows])), rows, tuple(sorted(cut)))  # fmt: skip

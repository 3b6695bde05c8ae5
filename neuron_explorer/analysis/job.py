"""How a job's ranks ended: the exception that ended the job first (and on which rank), the
errors it caused in the other ranks, and the ranks that wrote no part at all (killed by a
signal, or crashed before their profiler stopped). Every page that shows a job's ranks shows
this first (`summary`, `analyze`, the Ranks page), since the steps a crash cut short are not
steady-state steps: facts.steps_w leaves each ended rank's last step out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model.manifest import Manifest
from .page import PageModel


@dataclass(frozen=True)
class RankEnding:
    """The exception that ended one rank's run (capture/ending.py's record)."""

    rank: int
    exception: str
    message: str
    op: str | None = None
    file: str | None = None
    line: int | None = None
    first: bool = False  # the job's first failure; the others' follow from it

    def text(self) -> str:
        where = f" in {self.op}" if self.op else ""
        if self.file:
            where += f" at {self.file}:{self.line}"
        return f"{self.exception}: {self.message}{where}"


@dataclass(frozen=True)
class JobEnding(PageModel):
    """What ended a job early, None-free: `ended` (first failure first) and `missing_ranks`."""

    ended: tuple[RankEnding, ...]
    missing_ranks: tuple[int, ...]

    def lines(self) -> list[str]:
        """One sentence per fact, the cause first."""
        out = []
        if self.missing_ranks:
            names = ", ".join(str(r) for r in self.missing_ranks)
            out.append(
                f"Rank(s) {names} wrote no profile: killed by a signal or crashed before their "
                "profiler stopped (their events are missing)"
            )
        several = len(self.ended) + len(self.missing_ranks) > 1
        for e in self.ended:
            if e.first and several:
                out.append(f"Rank {e.rank} failed first: {e.text()}")
            elif e.first:
                out.append(f"Rank {e.rank} ended by {e.text()}")
            else:
                out.append(f"Rank {e.rank} then ended by {e.text()}")
        if self.ended:
            out.append("each ended rank's last step is partial and left out of the analysis")
        return out


def job_ending(manifest: Manifest) -> JobEnding | None:
    """The job's ending from its manifest (None for a run that ended normally)."""
    extra = manifest.extra
    missing = tuple(int(r) for r in extra.get("missing_ranks") or ())
    records = dict(extra.get("ranks_ended") or {})
    if not records and extra.get("run_ended"):  # one rank's own profile
        rank = manifest.ranks[0] if manifest.ranks else 0
        records = {str(rank): {**extra["run_ended"], "rank": rank}}
    if not records and not missing:
        return None
    # a missing rank (no part: killed) failed before the ranks that wrote their errors
    first = {} if missing else extra.get("run_ended") or {}
    ended = [_ending(int(r), rec, bool(first) and (rec == first or len(records) == 1))
             for r, rec in records.items()]  # fmt: skip
    ended.sort(key=lambda e: (not e.first, e.rank))
    return JobEnding(tuple(ended), missing)


def ended_ranks(manifest: Manifest) -> list[int]:
    """The ranks whose run an exception ended (their last step is partial)."""
    ending = job_ending(manifest)
    return [e.rank for e in ending.ended] if ending else []


def _ending(rank: int, rec: dict[str, Any], first: bool) -> RankEnding:
    return RankEnding(
        rank=rank,
        exception=str(rec.get("exception") or "error"),
        message=str(rec.get("message") or ""),
        op=rec.get("op"),
        file=rec.get("file"),
        line=rec.get("line"),
        first=first,
    )

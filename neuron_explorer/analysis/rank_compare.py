"""Two ranks of one job side by side: each rank of a job's profile read as a profile of its own
(model.combine.rank_view), compared as two profiles are (analysis/compare.py)."""

from __future__ import annotations

from pathlib import Path

from ..model.combine import rank_view
from ..model.profile import Profile
from .compare import Comparison, diff


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

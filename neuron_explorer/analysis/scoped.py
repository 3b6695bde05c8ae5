"""Which profile an analysis reads: the profile itself, or, for one too big to analyse whole,
the excerpt the import cut from it (model/excerpt.py), whose analysis the import stored in the
excerpt's own analysis/ folder (analysis/stored.py). Each answer carries the excerpt's `scope`
so a reader says what was analysed."""

from __future__ import annotations

from typing import Any

from ..model.excerpt import choose, open_excerpt, scope_of, write_excerpt
from ..model.profile import Profile
from . import stored


def analysed(profile: Profile) -> Profile:
    """The excerpt of `profile` when it has one (the import found the whole too big), else
    `profile` itself."""
    return open_excerpt(profile) or profile


def store_excerpt(profile: Profile, budget: int | None, why: str) -> Profile:
    """Cut the excerpt that fits the import's analysis memory (`budget`, bytes, or None: the
    machine's share) and store its analysis in its folder; the excerpt, opened. It is sized
    by the estimate a server admits tables by (model/footprint.py), so a server whose ceiling
    is `budget` can compute its analysis again when the stored one is stale."""
    limit, _ = stored.analysis_limit(budget)
    window = choose(profile, stored.events_within(limit, profile))
    part = write_excerpt(profile, window, why)
    stored.write(part)
    return part


def store_analysis(profile: Profile, budget: int | None) -> str:
    """Store what a server's first visit of `profile` reads (analysis/stored.py): its whole
    analysis when that fits the analysis memory (`budget`, as store_excerpt), else a new
    excerpt's; one line saying which ("" for a profile under STORE_MIN_EVENTS, or a folder
    that cannot be written). The import runs it, and `analyze --store` again (after an
    upgrade: the stored analysis is then stale, and an excerpt is cut as this version cuts)."""
    why = stored.too_big(profile, budget)
    if why:
        part = store_excerpt(profile, budget, why)
        return f"{scope_line(scope_of(part))}; kept in {part.path}"
    if profile.row_count("events") < stored.STORE_MIN_EVENTS or not stored.write(profile):
        return ""
    return f"stored the first page's analysis in {profile.path / stored.FOLDER}"


def scope_line(scope: dict[str, Any] | None) -> str:
    """One line saying what an excerpt's analysis covers ("" for a whole profile)."""
    if not scope:
        return ""
    if scope.get("steps"):
        a, b = scope["steps"]
        what = f"step {a}" if a == b else f"steps {a}-{b}"
        what += f" ({scope.get('step_count', 0):,} of {scope.get('of_steps', 0):,} steps,"
    else:
        t0, t1 = scope.get("window_ns") or (0, 0)
        what = f"{(t1 - t0) / 1e6:,.3f} ms from {t0 / 1e6:,.3f} ms ("
    return (f"analysed: {what} {_count(scope['events'])} of {_count(scope['of_events'])} "
            f"events): {scope['why']}")  # fmt: skip


def _count(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1_000_000 else f"{n:,}"


__all__ = ["analysed", "scope_line", "scope_of", "store_analysis", "store_excerpt"]

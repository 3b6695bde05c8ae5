"""The regression verdict of `neuron-explorer diff BASE NEW --gate 5%`: did the median step (or
a named metric, per step) get slower by more than the gate, with confidence from the steps'
spread? A one-sided Mann-Whitney test over the per-step values (exact for small samples)
says whether NEW's steps are slower than BASE's beyond chance; with fewer than MIN_STEPS steps
on a side, or a change past the gate that the spread does not support, the verdict is
"inconclusive"."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from math import comb, erf, sqrt

import numpy as np

from ..errors import ExplorerError
from ..model.profile import Profile
from .page import PageModel
from .steps import job_steps, profile_steps

MIN_STEPS = 3  # per side: with 3 and 3, only "every NEW step slower than every BASE step" passes
ALPHA = 0.05  # the chance of calling noise a regression
EXACT_MAX = 20_000  # the exact test enumerates at most this many splits (normal beyond)
VERDICTS = ("pass", "regression", "inconclusive")


@dataclass(frozen=True)
class GateVerdict(PageModel):
    """The verdict, with what it rests on: each side's per-step values and medians."""

    verdict: str  # one of VERDICTS
    reason: str
    metric: str  # "step", or op=NAME / kernel=NAME: that op's device time per step
    gate: float  # the allowed rise, as a fraction (0.05)
    base_median_ns: float | None
    new_median_ns: float | None
    change: float | None  # new median / base median - 1
    p_value: float | None  # one-sided: NEW's steps larger than BASE's by chance
    base_steps: tuple[int, ...]
    new_steps: tuple[int, ...]
    min_steps: int = MIN_STEPS
    alpha: float = ALPHA


def parse_gate(text: str) -> float:
    """'5%' or '0.05' -> 0.05."""
    t = text.strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ExplorerError(f"--gate {text!r}: write a percentage such as 5%") from None
    if not 0 <= value < 10:
        raise ExplorerError(f"--gate {text!r}: the gate must be between 0% and 1000%")
    return value


def per_step(profile: Profile, metric: str = "step") -> list[int]:
    """The metric's value of every whole step of the job (steps.job_steps: each step its
    slowest rank's; a step the profiler cut short is dropped)."""
    steps = job_steps(profile_steps(profile))
    if steps is None:
        return []
    if metric == "step":
        return [ns for _, _, ns in steps.per_step]
    field, sep, name = metric.partition("=")
    if not sep or field not in ("op", "kernel") or not name:
        raise ExplorerError(f"--metric {metric!r}: use step, op=NAME or kernel=NAME")
    column = "op_name" if field == "op" else "name"
    rows = (
        profile.duckdb()
        .execute(
            f"SELECT step, sum(dur_ns) FROM events WHERE layer = 'device' AND {column} = ? "
            "AND step IS NOT NULL GROUP BY step ORDER BY step",
            [name],
        )
        .fetchall()
    )
    have = {int(s): int(v) for s, v in rows}
    return [have.get(s, 0) for s, _, _ in steps.per_step if s is not None]


def mann_whitney_p(base: list[int], new: list[int]) -> float:
    """One-sided p-value of NEW's values being larger than BASE's by chance (ties count half)."""
    n, m = len(base), len(new)
    pooled = [*base, *new]

    def u_of(idx: tuple[int, ...]) -> float:
        chosen = set(idx)
        b = [pooled[i] for i in range(n + m) if i not in chosen]
        x = [pooled[i] for i in idx]
        return sum(1.0 if xi > bi else 0.5 if xi == bi else 0.0 for xi in x for bi in b)

    observed = u_of(tuple(range(n, n + m)))
    if comb(n + m, m) <= EXACT_MAX:
        total = at_least = 0
        for idx in combinations(range(n + m), m):
            total += 1
            at_least += u_of(idx) >= observed - 1e-9
        return at_least / total
    mu, sigma = n * m / 2, sqrt(n * m * (n + m + 1) / 12)
    z = (observed - 0.5 - mu) / sigma
    return 0.5 * (1 - erf(z / sqrt(2)))


def verdict(base: Profile, new: Profile, gate: float, metric: str = "step") -> GateVerdict:
    """NEW against BASE under the gate."""
    a, b = per_step(base, metric), per_step(new, metric)
    med_a = float(np.median(a)) if a else None
    med_b = float(np.median(b)) if b else None
    change = (med_b / med_a - 1) if med_a and med_b is not None else None
    p = mann_whitney_p(a, b) if a and b else None
    if len(a) < MIN_STEPS or len(b) < MIN_STEPS:
        v, why = "inconclusive", (f"{len(a)} base and {len(b)} new steps: the gate needs at "
                                  f"least {MIN_STEPS} whole steps on each side")  # fmt: skip
    elif change is None:
        v, why = "inconclusive", f"the base's {metric} is 0 in every step"
    elif change <= gate:
        v, why = "pass", f"median {metric} {100 * change:+.1f}%, within the gate of {100 * gate:g}%"
    elif p is not None and p <= ALPHA:
        v, why = "regression", (f"median {metric} {100 * change:+.1f}%, past the gate of "
                                f"{100 * gate:g}%; p = {p:.3g} that the steps' spread explains it")  # fmt: skip
    else:
        v, why = "inconclusive", (f"median {metric} {100 * change:+.1f}% but the steps' spread "
                                  f"explains it (p = {p:.3g} > {ALPHA}); record more steps")  # fmt: skip
    return GateVerdict(v, why, metric, gate, med_a, med_b, change, p, tuple(a), tuple(b))

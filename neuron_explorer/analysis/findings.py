"""What a rule reports: a `Finding` with its evidence (frozen, JSON-serialisable records), and
the findings page model, `FindingsReport`: the one findings document."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..model.profile import Profile
from .page import PageModel

SEVERITIES = ("low", "medium", "high")  # ordered, least to most severe
# ranked in this order: what keeps a model from running right on the device comes first
CATEGORIES = ("readiness", "performance")


@dataclass(frozen=True)
class Hotspot:
    """One row of evidence: an op, a kernel or a source line, with the time it accounts for."""

    label: str  # op or kernel name, or "file:line"
    dur_ns: int
    count: int
    file: str | None = None
    line: int | None = None
    func: str | None = None
    note: str = ""  # extra per-row detail, e.g. the shapes or the reason


@dataclass(frozen=True)
class Evidence:
    """What a finding rests on: event ids to look at, the ops and source lines that carry the
    time, and named numbers the rule measured."""

    event_ids: tuple[int, ...] = ()
    ops: tuple[Hotspot, ...] = ()
    source_lines: tuple[Hotspot, ...] = ()
    metrics: dict[str, float] = field(default_factory=dict)
    # where in the model the evidence events are: their model lines (a library's modeling file
    # for a Transformers model) and nn.Module paths (analysis/hotspots.py cites them)
    # (added after the rule ran, so equal findings stay equal with or without them)
    model_lines: tuple[Hotspot, ...] = field(default=(), compare=False)
    modules: tuple[Hotspot, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Finding:
    """One problem found in a profile, with what fixing it would save."""

    rule: str
    severity: str  # low | medium | high
    title: str  # one line
    detail: str  # a paragraph
    fix: str  # a concrete change to make
    saving_ns: int  # estimated time saved over the profiled steps
    saving_share: float  # saving_ns over the total profiled step time (0..1)
    evidence: Evidence = Evidence()
    category: str = "performance"  # readiness (runs wrong or off the device) | performance

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def severity_for(share: float, floor: str = "low") -> str:
    """Severity from the share of step time at stake, never below the rule's own floor."""
    by_share = "high" if share >= 0.2 else "medium" if share >= 0.05 else "low"
    return max(by_share, floor, key=SEVERITIES.index)


def rank_findings(findings: list[Finding]) -> list[Finding]:
    """Readiness findings first, then performance; within each, largest estimated saving
    first, ties by severity, then rule id for a stable order."""
    return sorted(
        findings,
        key=lambda f: (
            CATEGORIES.index(f.category), -f.saving_ns, -SEVERITIES.index(f.severity), f.rule,
            f.title,
        ),
    )  # fmt: skip


@dataclass(frozen=True)
class FindingsReport(PageModel):
    """The findings page and `analyze --json`: the rules run over the profile's steps, and
    what they found, readiness first, then largest saving first."""

    profile: str
    source: str
    total_step_ns: int
    steps: int  # ProfilerStep windows (0: the whole trace is one window)
    rules_run: tuple[str, ...]
    findings: tuple[Finding, ...]


def findings_report(
    profile: Profile, ids: Iterable[str] | None = None, findings: list[Finding] | None = None
) -> FindingsReport:
    """The rules named by `ids` (all by default) over `profile`; `findings` when they already
    ran (run_rules' ranked list)."""
    from . import all_rules, run_rules
    from .context import context

    if findings is None:
        findings = run_rules(profile, ids)
    ctx = context(profile)
    with ctx.lock:
        steps = ctx.steps().num_rows if ctx.has_steps else 0
        total = ctx.total_step_ns
    rules = sorted(ids) if ids is not None else sorted(all_rules())
    return FindingsReport(str(profile.path), profile.manifest.source, total, steps,
                          tuple(rules), tuple(findings))  # fmt: skip

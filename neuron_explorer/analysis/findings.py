"""What a rule reports: a `Finding` with its evidence. Frozen, JSON-serialisable records, the
bottom of the rules (the findings page model, `FindingsReport`, is in runner.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
    # the change the saving replays ("these 12 syncs removed"); "" when the rule estimates it
    replayed: str = ""
    # a saving not replayed: an upper bound, and why no replay holds it ("" when replayed or 0)
    bound: str = ""
    # the other findings (rule ids) whose savings overlap this one's: fixing both saves less
    # than the sum (their changes replayed together; runner.py adds it)
    overlaps: tuple[str, ...] = field(default=(), compare=False)

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

"""The run of the rules over a profile: each rule in scope measures, gates and explains on the
profile's one shared context; the findings are then cited in the model and ranked. And the
findings page model, `FindingsReport`: the one findings document (`analyze --json`, the web's
findings twin)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import ExplorerError
from ..model.excerpt import scope_of
from ..model.profile import Profile
from .context import context
from .findings import Finding, rank_findings
from .job import JobEnding, job_ending
from .page import PageModel, is_modeled
from .rule import applies
from .rules import RULES, get_rule


def run_rules(profile: Profile, ids: Iterable[str] | None = None) -> list[Finding]:
    """Evaluate the rules (all, or those named by `ids`) whose scope admits the profile, and
    rank the findings (readiness first, then by saving)."""
    import duckdb

    rules = [get_rule(i) for i in ids] if ids is not None else list(RULES)
    ctx = context(profile)
    findings: list[Finding] = []
    for rule in rules:
        with ctx.lock:
            if not applies(rule, ctx):
                continue
            try:
                findings.extend(rule.check(ctx))
            except duckdb.Error as e:  # e.g. malformed JSON in args: name the rule and profile
                line = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise ExplorerError(f"{profile.path}: rule {rule.id} failed: {line}") from None
    from .hotspots import cite_model

    with ctx.lock:
        findings = mark_overlaps(ctx, findings)
    return rank_findings(cite_model(profile, findings))


OVERLAP_SLACK = 0.02  # two savings "add" when their joint replay is within this of the sum
# the rules whose bound is time ranks wait at collectives for the last rank (or spend in them)
WAIT_BOUNDS = ("straggler", "collective-outliers", "pipeline-bubbles", "collective-share")


def mark_overlaps(ctx, findings: list[Finding]) -> list[Finding]:
    """Each replayed finding names the others whose changes, replayed together, save less
    than their two savings added: they touch the same time, and fixing both saves less. The
    bounds on collectives' waits overlap each other, and a replayed finding whose change cuts
    those waits."""
    import dataclasses

    from .replay_saving import joint_saving

    # a saving of 0 overlaps nothing (and most device-side savings are 0 in host-bound steps):
    # only the others are replayed in pairs
    keyed = [((f.rule, f.title), f) for f in findings if f.replayed and f.saving_ns > 0]
    overlaps: dict[tuple[str, str], list[str]] = {k: [] for k, _ in keyed}
    for i, (ka, fa) in enumerate(keyed):
        for kb, fb in keyed[i + 1 :]:
            joint = joint_saving(ctx, ka, kb)
            both = fa.saving_ns + fb.saving_ns
            if joint is not None and joint < both * (1 - OVERLAP_SLACK):
                overlaps[ka].append(fb.rule)
                overlaps[kb].append(fa.rule)
    _wait_overlaps(ctx, findings, keyed, overlaps)
    return [dataclasses.replace(f, overlaps=tuple(overlaps[(f.rule, f.title)]))
            if overlaps.get((f.rule, f.title)) else f for f in findings]  # fmt: skip


def _wait_overlaps(ctx, findings: list[Finding], keyed: list, overlaps: dict) -> None:
    """Bounds on collectives' waits (not replayed) touch the same time as each other, and as
    a replayed change that shortens the waits by more than OVERLAP_SLACK of the bound."""
    from .replay_saving import waits_cut

    bounds = [((f.rule, f.title), f) for f in findings
              if not f.replayed and f.saving_ns > 0 and f.rule in WAIT_BOUNDS]  # fmt: skip
    for kb, _ in bounds:
        overlaps.setdefault(kb, [])
    for i, (ka, fa) in enumerate(bounds):
        for kb, fb in bounds[i + 1 :]:
            overlaps[ka].append(fb.rule)
            overlaps[kb].append(fa.rule)
    if not bounds:
        return
    for kr, fr in keyed:
        cut = waits_cut(ctx, kr)
        for kb, fb in bounds:
            if cut > fb.saving_ns * OVERLAP_SLACK:
                overlaps[kr].append(fb.rule)
                overlaps[kb].append(fr.rule)


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
    # the exception that ended the run (capture/ending.py): the findings judge only what ran
    run_ended: dict[str, Any] | None = None
    job_ending: JobEnding | None = None  # a job's ranks that failed or wrote nothing (job.py)
    # the replayed findings' changes replayed together: what fixing all of them saves, never
    # more than the steps (their own savings may add past it when they touch the same time);
    # None when no finding replayed its saving
    replayed_total_ns: int | None = None
    replayed_total_share: float = 0.0
    # a neuron capture's device times, and so the savings, come from the cost model
    device_time_modeled: bool = False
    scope: dict[str, Any] | None = None  # an excerpt's (model/excerpt.py), None: the whole


def findings_report(
    profile: Profile, ids: Iterable[str] | None = None, findings: list[Finding] | None = None
) -> FindingsReport:
    """The rules named by `ids` (all by default) over `profile`; `findings` when they already
    ran (run_rules' ranked list)."""
    if findings is None:
        findings = run_rules(profile, ids)
    ctx = context(profile)
    with ctx.lock:
        steps = ctx.steps().num_rows if ctx.has_steps else 0
        total = ctx.total_step_ns
        joint = replayed_total(ctx, findings)
    rules = sorted(ids) if ids is not None else sorted(r.id for r in RULES)
    share = round(min(joint / total, 1.0), 6) if joint is not None and total > 0 else 0.0
    return FindingsReport(str(profile.path), profile.manifest.source, total, steps,
                          tuple(rules), tuple(findings),
                          profile.manifest.extra.get("run_ended"),
                          job_ending(profile.manifest), joint, share,
                          is_modeled(profile), scope_of(profile))  # fmt: skip


def replayed_total(ctx, findings: Iterable[Finding]) -> int | None:
    """The saving of every replayed finding's change replayed together (None: none replayed,
    or their changes are not known to this context)."""
    from .replay_saving import joint_saving

    keys = [(f.rule, f.title) for f in findings if f.replayed]
    if not keys:
        return None
    joint = joint_saving(ctx, *keys)
    if joint is None:
        return None
    return min(joint, ctx.total_step_ns) if ctx.total_step_ns > 0 else joint

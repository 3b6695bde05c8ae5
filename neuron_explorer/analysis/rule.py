"""A rule is metadata plus three steps kept apart: `measure` reads the shared facts of a profile
into typed facts, `gate` applies the rule's named thresholds to them, and `explain` writes the
finding's prose. The runner (findings.py) calls them in that order; the list of rules is the
explicit `RULES` tuple in analysis/rules/__init__.py (docs/architecture.md)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from ..model.profile import Profile
from .context import AnalysisContext, context
from .conventions import TRACE_COMPILE_PREDICATE
from .findings import Evidence, Finding, Hotspot, severity_for
from .replay_saving import Replayed, replay_saving

FactsT = TypeVar("FactsT")
SCOPES = ("any", "neuron", "gpu")  # which profiles a rule is run on (Rule.scope)


@dataclass(frozen=True)
class Draft:
    """What `explain` writes for one finding; the runner adds severity and share from the
    saving (the same arithmetic for every rule)."""

    title: str  # one line
    detail: str  # a paragraph
    saving_ns: float
    evidence: Evidence = Evidence()
    fix: str | None = None  # the rule's own `fix` when None
    category: str | None = None  # the rule's own `category` when None
    # the change the fix makes, as data: when given, saving_ns is replaced by the replayed
    # steps' drop (replay_saving.py)
    change: Replayed | None = None
    # a saving the rule cannot replay: why, and that saving_ns is an upper bound (docs/rules.md)
    bound: str | None = None


class Rule(Generic[FactsT]):
    """Base class. Subclasses set `id`, `title`, `severity`, `scope` and UPPER_CASE threshold
    attributes, write a docstring with "Pattern:" and "Algorithm:", and implement `measure`
    (None when the pattern is absent), `gate` and `explain` (and `evidence` when the evidence
    needs queries beyond the facts)."""

    id: ClassVar[str]
    title: ClassVar[str]
    severity: ClassVar[str] = "medium"  # the floor; a large share of step time raises it
    # "any" trace; "neuron": a neuron capture (the device spec or neuron devices); "gpu": a
    # trace with GPU kernels. The runner skips a rule on other profiles (findings.py).
    scope: ClassVar[str] = "any"
    fix: ClassVar[str] = ""
    # "readiness": a porting problem: the model does not run right on the device (CPU
    # fallbacks, float64 computed as float32, unsupported areas): ranked first, whatever the
    # saving. A host sync is not one: it runs right, and ranks by its saving;
    # "performance": it runs right but slower than it could. A finding may override it.
    category: ClassVar[str] = "performance"

    def measure(self, ctx: AnalysisContext) -> FactsT | None:
        """The typed facts this rule judges, read from the context (None: nothing to judge)."""
        raise NotImplementedError

    def gate(self, facts: FactsT) -> bool:
        """Whether the facts pass the rule's thresholds (a finding is written)."""
        raise NotImplementedError

    def evidence(self, ctx: AnalysisContext, facts: FactsT) -> Any:
        """The evidence rows, queried only once the gate has passed: an Evidence (or, for a
        rule that writes several findings, what its explain needs for each)."""
        return Evidence()

    def explain(self, facts: FactsT, evidence: Any) -> Draft | Sequence[Draft]:
        """The finding's title, detail, saving and evidence, from the facts alone."""
        raise NotImplementedError

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        """measure -> gate -> evidence -> explain, on a context the caller holds."""
        facts = self.measure(ctx)
        if facts is None or not self.gate(facts):
            return []
        drafts = self.explain(facts, self.evidence(ctx, facts))
        if isinstance(drafts, Draft):
            drafts = (drafts,)
        drafts = [self._replayed(ctx, d) for d in drafts]
        return [self.finding(ctx.total_step_ns, d) for d in drafts]

    def _replayed(self, ctx: AnalysisContext, draft: Draft) -> Draft:
        """The draft with its saving replayed, when it names its change."""
        if draft.change is None:
            return draft
        ns = replay_saving(ctx, draft.change, (self.id, draft.title))
        return dataclasses.replace(draft, saving_ns=ns)

    def evaluate(self, profile: Profile) -> list[Finding]:
        """The findings of this rule on a profile (empty when the problem is absent or the
        profile is outside the rule's scope)."""
        ctx = context(profile)
        with ctx.lock:
            if not applies(self, ctx):
                return []
            return self.check(ctx)

    @classmethod
    def thresholds(cls) -> dict[str, Any]:
        """The rule's named thresholds (its UPPER_CASE class attributes)."""
        out: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            for k, v in vars(klass).items():
                if k.isupper() and not k.startswith("_"):
                    out[k] = v
        return out

    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    def finding(self, total_step_ns: int, draft: Draft) -> Finding:
        saving = max(int(draft.saving_ns), 0)
        if total_step_ns > 0:  # a fix gives back at most the steps' time
            saving = min(saving, total_step_ns)
        share = min(saving / total_step_ns, 1.0) if total_step_ns > 0 else 0.0
        return Finding(
            rule=self.id,
            severity=severity_for(share, self.severity),
            title=draft.title,
            detail=draft.detail,
            fix=draft.fix or self.fix,
            saving_ns=saving,
            saving_share=round(share, 6),
            evidence=draft.evidence,
            category=draft.category or self.category,
            replayed=draft.change.what if draft.change is not None else "",
            bound="" if draft.change is not None or saving == 0 else draft.bound or "",
        )


def applies(rule: Rule, ctx: AnalysisContext) -> bool:
    """Whether `rule.scope` admits this profile."""
    if rule.scope == "neuron":
        return ctx.is_neuron
    if rule.scope == "gpu":
        return ctx.has_gpu
    return True


def hotspots(
    rows: list[dict[str, Any]], *, label: str = "label", note: str | None = None
) -> tuple[Hotspot, ...]:
    """Evidence rows from aggregated query rows with label/dur_ns/count (and file/line/func)."""
    out = []
    for r in rows:
        out.append(
            Hotspot(
                label=str(r[label]),
                dur_ns=int(r.get("dur_ns") or 0),
                count=int(r.get("count") or 0),
                file=r.get("file"),
                line=None if r.get("line") is None else int(r["line"]),
                func=r.get("func"),
                note="" if note is None or r.get(note) is None else str(r[note]),
            )
        )
    return tuple(out)


def fmt_ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def fmt_pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def top_ops(
    ctx: AnalysisContext, where: str, limit: int = 5, by: str = "dur_ns"
) -> tuple[Hotspot, ...]:
    """The ops (the framework op, else the event name) carrying most time (or, by="count",
    most events) among `where` rows."""
    order = "count DESC, dur_ns DESC" if by == "count" else "dur_ns DESC"
    rows = ctx.rows(
        f"""SELECT coalesce(op_name, name) AS label, sum(dur_ns) AS dur_ns, count(*) AS count
        FROM ev WHERE {where} GROUP BY 1 ORDER BY {order}, label LIMIT {int(limit)}"""
    )
    return hotspots(rows)


def top_lines(
    ctx: AnalysisContext, where: str, limit: int = 5, by: str = "dur_ns"
) -> tuple[Hotspot, ...]:
    """The user source lines carrying most time (or, by="count", most events) among `where`
    rows."""
    order = "count DESC, dur_ns DESC" if by == "count" else "dur_ns DESC"
    rows = ctx.rows(
        f"""SELECT src_file || ':' || src_line AS label, src_file AS file, src_line AS line,
               any_value(src_func) AS func, sum(dur_ns) AS dur_ns, count(*) AS count
        FROM ev WHERE ({where}) AND src_file IS NOT NULL
        GROUP BY src_file, src_line ORDER BY {order}, label LIMIT {int(limit)}"""
    )
    return hotspots(rows)


def longest_ids(ctx: AnalysisContext, where: str, limit: int = 20) -> tuple[int, ...]:
    """Ids of the longest events among `where` rows, to jump to in a timeline."""
    return ids_of(ctx, f"SELECT id FROM ev WHERE {where} ORDER BY dur_ns DESC, id LIMIT {limit}")


def ids_of(ctx: AnalysisContext, sql: str, tables: dict[str, Any] | None = None) -> tuple[int, ...]:
    """The `id` column of a query's rows as event ids, in its order."""
    return tuple(int(r["id"]) for r in ctx.rows(sql, tables=tables))


def torch_compile_trace_ns(ctx: AnalysisContext, *, around_recompiles: bool) -> int:
    """Host time in torch.compile's own outermost spans (dynamo tracing, AOT autograd) beyond
    the backend compile events inside them. around_recompiles=True: the spans that contain a
    recompile (recompilation's cost); False: the others, the first compiles (compile-dominated's).
    Reads the shared `recompiles` table."""
    has = "EXISTS" if around_recompiles else "NOT EXISTS"
    member = "IN" if around_recompiles else "NOT IN"
    row = ctx.one(
        f"""WITH t AS (SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM ev
                       WHERE {TRACE_COMPILE_PREDICATE}),
             top AS (SELECT * FROM t WHERE NOT EXISTS (SELECT 1 FROM t o WHERE o.rank = t.rank
                     AND o.s <= t.s AND o.e >= t.e AND (o.s < t.s OR o.e > t.e))),
             sel AS (SELECT DISTINCT * FROM top WHERE {has} (SELECT 1 FROM recompiles r
                     WHERE r.rank = top.rank AND r.start_ns >= top.s
                     AND r.start_ns + r.dur_ns <= top.e)),
             c AS (SELECT rank, start_ns, dur_ns FROM ev WHERE layer = 'host' AND kind = 'compile'
                   AND id {member} (SELECT id FROM recompiles))
        SELECT coalesce((SELECT sum(e - s) FROM sel), 0) - coalesce((SELECT sum(c.dur_ns)
               FROM c JOIN sel ON c.rank = sel.rank AND c.start_ns >= sel.s
               AND c.start_ns + c.dur_ns <= sel.e), 0) AS ns""",
    )
    return max(int(row.get("ns") or 0), 0)


def device_busy_ns(ctx: AnalysisContext) -> int:
    """The time the device works in the steps (any work, overlaps counted once): the most a
    device-side fix can give back, whatever the per-event durations add up to."""
    b = ctx.breakdown
    total = 0
    for dur, idle in zip(b["dur_ns"].to_pylist(), b["device_idle_ns"].to_pylist(), strict=True):
        if idle is not None:
            total += max(int(dur) - int(idle), 0)
    return total


HOST_BOUND = (
    " The saving is device time: while the steps are launch-bound (launch-bound), the host's "
    "launches set the step time, which shortens less."
)


def host_bound(ctx: AnalysisContext) -> bool:
    """Whether some steps are launch-bound (the shared `launch_bound_steps`): a device-side
    saving then shortens them less than it saves."""
    return bool(ctx.one("SELECT count(*) AS n FROM launch_bound_steps")["n"])

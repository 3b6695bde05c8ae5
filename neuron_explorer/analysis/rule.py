"""A rule is metadata plus a pure function: `evaluate(profile) -> list[Finding]`. Rules register
themselves with `@register`; explorer/analysis/rules/__init__.py imports each rule module."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from ..errors import ExplorerError
from ..model.profile import Profile
from .context import AnalysisContext, context
from .conventions import TRACE_COMPILE_PREDICATE
from .findings import Evidence, Finding, Hotspot, severity_for

RULES: dict[str, Rule] = {}


class Rule:
    """Base class. Subclasses set `id`, `title`, `severity`, `scope` and UPPER_CASE threshold
    attributes, write a docstring with "Pattern:" and "Algorithm:", and implement `check`."""

    id: ClassVar[str]
    title: ClassVar[str]
    severity: ClassVar[str] = "medium"  # the floor; a large share of step time raises it
    scope: ClassVar[str] = "any"  # "any" trace, or "neuron" (needs a neuron capture)
    fix: ClassVar[str] = ""
    # "readiness": a porting problem: the model does not run right on the device (CPU
    # fallbacks, float64 computed as float32, unsupported areas): ranked first, whatever the
    # saving. A host sync is not one: it runs right, and ranks by its saving;
    # "performance": it runs right but slower than it could. A finding may override it.
    category: ClassVar[str] = "performance"

    def evaluate(self, profile: Profile) -> list[Finding]:
        """The findings of this rule on a profile (empty when the problem is absent)."""
        ctx = context(profile)
        with ctx.lock:
            return self.check(ctx)

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        raise NotImplementedError

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

    def finding(
        self,
        ctx: AnalysisContext,
        *,
        title: str,
        detail: str,
        saving_ns: float,
        evidence: Evidence | None = None,
        fix: str | None = None,
        category: str | None = None,
    ) -> Finding:
        saving = max(int(saving_ns), 0)
        total = ctx.total_step_ns
        share = min(saving / total, 1.0) if total > 0 else 0.0
        return Finding(
            rule=self.id,
            severity=severity_for(share, self.severity),
            title=title,
            detail=detail,
            fix=fix or self.fix,
            saving_ns=saving,
            saving_share=round(share, 6),
            evidence=evidence or Evidence(),
            category=category or self.category,
        )


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: add a rule to the registry under its id."""
    if cls.id in RULES:
        raise ValueError(f"duplicate rule id {cls.id}")
    RULES[cls.id] = cls()
    return cls


def all_rules() -> dict[str, Rule]:
    from . import rules  # noqa: F401 - importing the package registers every rule

    return RULES


def get_rule(rule_id: str) -> Rule:
    rules = all_rules()
    if rule_id not in rules:
        raise ExplorerError(f"unknown rule {rule_id!r}; known rules: {', '.join(sorted(rules))}")
    return rules[rule_id]


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
    rows = ctx.con.execute(
        f"SELECT id FROM ev WHERE {where} ORDER BY dur_ns DESC, id LIMIT {int(limit)}"
    ).fetchall()
    return tuple(int(r[0]) for r in rows)


def torch_compile_trace_ns(ctx: AnalysisContext, *, around_recompiles: bool) -> int:
    """Host time in torch.compile's own outermost spans (dynamo tracing, AOT autograd) beyond
    the backend compile events inside them. around_recompiles=True: the spans that contain a
    recompile (recompilation's cost); False: the others, the first compiles (compile-dominated's).
    Needs ctx.ensure_recompiles()."""
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
               AND c.start_ns + c.dur_ns <= sel.e), 0) AS ns"""
    )
    return max(int(row.get("ns") or 0), 0)

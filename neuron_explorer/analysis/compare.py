"""The comparison of two profiles: step time, the per-step breakdown, and ops, kernels, source
lines and modules with deltas (largest change first), and the findings that appeared or went.
`neuron-explorer diff A B` prints it and /api/compare returns its to_dict()."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from ..vocab.kinds import KERNEL_KINDS
from .page import PageModel, is_modeled
from .steps import JobSteps, StepStats, job_steps, profile_steps

TOP = 200  # rows kept per table, largest change first


@dataclass(frozen=True)
class Side:
    """What the comparison reads of one profile (the web builds it from its caches)."""

    name: str
    steps: StepStats | None
    summary: dict[str, Any] | None  # Summary.to_dict(), for its breakdown and step count
    ops: pa.Table  # operators.operator_table
    lines: pa.Table  # lines.line_table
    kernels: pa.Table  # kernel_table
    modules: tuple[dict[str, Any], ...]  # hotspots.module_tree as dicts
    findings: tuple[dict[str, Any], ...] | None  # Finding.to_dict()s, ranked; None: not yet
    modeled: bool


def kernel_table(con) -> pa.Table:
    """Device kernels by name: launches and total time."""
    kinds = ", ".join(f"'{k}'" for k in KERNEL_KINDS)
    return con.sql(
        "SELECT CAST(name AS VARCHAR) AS name, count(*) AS count, sum(dur_ns)::BIGINT AS time_ns "
        f"FROM events WHERE kind IN ({kinds}) GROUP BY 1"
    ).to_arrow_table()


def side(profile: Profile, name: str | None = None) -> Side:
    """Everything the comparison reads of `profile`, computed now (the CLI's path)."""
    from . import run_rules, summarize
    from .context import context
    from .hotspots import module_tree
    from .lines import line_table
    from .operators import operator_table

    ctx = context(profile)
    with ctx.lock:
        ops, lines = operator_table(ctx.cols), line_table(ctx.cols)
    con = profile.duckdb()
    return Side(
        name=name if name is not None else str(profile.path),
        steps=profile_steps(profile),
        summary=summarize(profile).to_dict(),
        ops=ops,
        lines=lines,
        kernels=kernel_table(con),
        modules=tuple(m.to_dict() for m in module_tree(profile, con)),
        findings=tuple(f.to_dict() for f in run_rules(profile)),
        modeled=is_modeled(profile),
    )


@dataclass(frozen=True)
class FindingsDiff:
    """Rules that found something in B and not in A (appeared), in A and not in B (went), and
    in both, with each side's top finding of the rule. `available` is false until both
    analyses are ready."""

    available: bool
    appeared: tuple[dict[str, Any], ...] = ()
    went: tuple[dict[str, Any], ...] = ()
    both: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Comparison(PageModel):
    """B against A. Each delta row holds its key columns, each side's values (`a`, `b`: empty
    where the side lacks the row), `delta` (B minus A) and `ratio` (B over A)."""

    a: str
    b: str
    steps: dict[str, StepStats | None]  # each rank's steps, as the summary gives them
    # the step time compared, as the gate judges it: each whole step its slowest rank's
    job_steps: dict[str, JobSteps | None]
    step_ns_delta: int | None  # median step time, B minus A (one slow compile step moves a mean)
    breakdown: tuple[dict[str, Any], ...]  # the median step of each, by part of the step
    ops: tuple[dict[str, Any], ...]  # host self plus device time
    lines: tuple[dict[str, Any], ...]  # host plus device time
    kernels: tuple[dict[str, Any], ...]  # device time
    modules: tuple[dict[str, Any], ...]  # device self time
    findings: FindingsDiff
    device_time_modeled: bool


def compare(a: Side, b: Side, top: int = TOP) -> Comparison:
    """B against A, the largest changes first, `top` rows per table."""
    ja, jb = job_steps(a.steps), job_steps(b.steps)
    return Comparison(
        a=a.name,
        b=b.name,
        steps={"a": a.steps, "b": b.steps},
        job_steps={"a": ja, "b": jb},
        step_ns_delta=round(jb.median_ns - ja.median_ns) if ja and jb else None,
        breakdown=tuple(compare_breakdown(a.summary, b.summary, ja, jb)),
        ops=tuple(compare_ops(a.ops, b.ops)[:top]),
        lines=tuple(compare_lines(a.lines, b.lines)[:top]),
        kernels=tuple(compare_kernels(a.kernels, b.kernels)[:top]),
        modules=tuple(compare_modules(a.modules, b.modules)[:top]),
        findings=compare_findings(a.findings, b.findings),
        device_time_modeled=a.modeled or b.modeled,
    )


def diff(
    a: Profile, b: Profile, a_name: str | None = None, b_name: str | None = None
) -> Comparison:
    """The comparison of profile `b` against profile `a` (the `diff` command)."""
    return compare(side(a, a_name), side(b, b_name))


def _delta_rows(
    a: pa.Table | list[dict], b: pa.Table | list[dict], key: tuple[str, ...], value: str,
    extra: tuple[str, ...] = (),
) -> list[dict[str, Any]]:  # fmt: skip
    rows: dict[tuple, dict[str, Any]] = {}
    for name, table in (("a", a), ("b", b)):
        for r in table.to_pylist() if isinstance(table, pa.Table) else table:
            k = tuple(r[c] for c in key)
            row = rows.setdefault(k, {**{c: r[c] for c in key}, "a": {}, "b": {}})
            row[name] = {c: r[c] for c in (value, *extra)}
    out = []
    for row in rows.values():
        va = row["a"].get(value, 0) or 0
        vb = row["b"].get(value, 0) or 0
        row["delta"] = vb - va
        row["ratio"] = vb / va if va else None
        out.append(row)
    # ties (two ranks of a symmetric job: every delta 0) by key, whatever order the tables had
    out.sort(key=lambda r: (-abs(r["delta"]), tuple(str(r[c]) for c in key)))
    return out


def _plus(t: pa.Table, x: str, y: str) -> pa.Table:
    return t.append_column("time_ns", pc.add(t.column(x), t.column(y)))


def compare_ops(a: pa.Table, b: pa.Table) -> list[dict[str, Any]]:
    """Op rows keyed by name; the value compared is host self time plus device time."""
    extra = ("count", "host_self_ns", "device_ns")
    return _delta_rows(_plus(a, "host_self_ns", "device_ns"), _plus(b, "host_self_ns", "device_ns"),
                       ("name",), "time_ns", extra)  # fmt: skip


def compare_kernels(a: pa.Table, b: pa.Table) -> list[dict[str, Any]]:
    """Kernel rows keyed by name; the value is the kernel's total device time."""
    return _delta_rows(a, b, ("name",), "time_ns", ("count",))


def compare_lines(a: pa.Table, b: pa.Table) -> list[dict[str, Any]]:
    """Source line rows keyed by (file, line); the value is host plus device time."""
    extra = ("host_ns", "device_ns", "ops")
    return _delta_rows(_plus(a, "host_ns", "device_ns"), _plus(b, "host_ns", "device_ns"),
                       ("file", "line"), "time_ns", extra)  # fmt: skip


def compare_modules(a: tuple[dict, ...], b: tuple[dict, ...]) -> list[dict[str, Any]]:
    """Module rows keyed by path; the value is the module's own device time (self)."""
    return _delta_rows(list(a), list(b), ("path",), "self_ns", ("total_ns", "calls", "kernels"))


def compare_breakdown(
    a: dict[str, Any] | None, b: dict[str, Any] | None, ja: JobSteps | None = None,
    jb: JobSteps | None = None,
) -> list[dict]:  # fmt: skip
    """The median step of each side, part by part (the summary's one partition of a step:
    device compute, communication, transfers, device idle by host cause), with deltas; the
    parts of each add up to its median step: the job's median step on its slowest rank where
    `ja`/`jb` are given, else the median of the summary's steps. Parts that are zero on both
    sides are left out."""
    ba = _median_step(a, ja.median_step if ja else None)
    bb = _median_step(b, jb.median_step if jb else None)
    if ba is None or bb is None:
        return []
    labels = {**_part_labels(a), **_part_labels(b)}
    keys = [k for k in labels if ba.get(k) or bb.get(k)]
    rows = [{"category": k, "label": labels[k], "a": ba.get(k, 0), "b": bb.get(k, 0),
             "delta": bb.get(k, 0) - ba.get(k, 0)} for k in keys]  # fmt: skip
    return sorted(rows, key=lambda r: -abs(r["delta"]))


def _part_labels(summary: dict[str, Any] | None) -> dict[str, str]:
    parts = ((summary or {}).get("breakdown") or {}).get("parts") or []
    return {p["key"]: p["label"] for p in parts}


def _median_step(
    summary: dict[str, Any] | None, at: tuple[int | None, int] | None = None
) -> dict[str, int] | None:
    """The per-step row of (step, rank) `at`, or of the step whose time is the median of the
    steps the statistics kept (the lower of the two middle ones), None without steps."""
    if not summary or not summary.get("steps") or not summary.get("step_stats"):
        return None
    found = [r for r in summary["steps"] if at and (r.get("step"), r.get("rank")) == at]
    if found:
        return {k: int(v) for k, v in found[0].items()
                if k.endswith("_ns") and isinstance(v, (int, float))}  # fmt: skip
    st = summary["step_stats"]
    out = {tuple(x) for x in (st.get("left_out") or [])}
    kept = [r for r in summary["steps"] if (r.get("rank"), r.get("step")) not in out]
    kept = sorted(kept or summary["steps"], key=lambda r: r["dur_ns"])
    row = kept[(len(kept) - 1) // 2]
    return {k: int(v) for k, v in row.items() if k.endswith("_ns") and isinstance(v, (int, float))}


def compare_findings(a, b) -> FindingsDiff:  # sequences of Finding.to_dict()s, or None
    """Findings match by rule (titles carry numbers that change); each side's top one."""
    if a is None or b is None:
        return FindingsDiff(available=False)
    ta, tb = _top_by_rule(a), _top_by_rule(b)
    return FindingsDiff(
        available=True,
        appeared=tuple(tb[r] for r in tb if r not in ta),
        went=tuple(ta[r] for r in ta if r not in tb),
        both=tuple({"rule": r, "a": ta[r], "b": tb[r]} for r in tb if r in ta),
    )


def _top_by_rule(found) -> dict[str, dict]:
    top: dict[str, dict] = {}
    for f in found:  # largest saving first already
        top.setdefault(f.get("rule") or "", f)
    return top

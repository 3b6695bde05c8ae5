"""Two profiles side by side: step time, breakdown, ops and source lines with deltas, the
largest change first."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ...vocab.kinds import KERNEL_KINDS
from .source import file_id


def _delta_rows(
    a: pa.Table, b: pa.Table, key: tuple[str, ...], value: str, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    rows: dict[tuple, dict[str, Any]] = {}
    for side, table in (("a", a), ("b", b)):
        for r in table.to_pylist():
            k = tuple(r[c] for c in key)
            row = rows.setdefault(k, {**{c: r[c] for c in key}, "a": {}, "b": {}})
            row[side] = {c: r[c] for c in (value, *extra)}
    out = []
    for row in rows.values():
        va = row["a"].get(value, 0) or 0
        vb = row["b"].get(value, 0) or 0
        row["delta"] = vb - va
        row["ratio"] = vb / va if va else None
        out.append(row)
    out.sort(key=lambda r: -abs(r["delta"]))
    return out


def compare_ops(a: pa.Table, b: pa.Table) -> list[dict[str, Any]]:
    """Op rows keyed by name; the value compared is host self time plus device time."""

    def total(t: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        return t.append_column("time_ns", pc.add(t.column("host_self_ns"), t.column("device_ns")))

    return _delta_rows(
        total(a), total(b), ("name",), "time_ns", ("count", "host_self_ns", "device_ns")
    )


def compare_lines(a: pa.Table, b: pa.Table) -> list[dict[str, Any]]:
    """Source line rows keyed by (file, line); the value is host plus device time."""

    def total(t: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        return t.append_column("time_ns", pc.add(t.column("host_ns"), t.column("device_ns")))

    rows = _delta_rows(
        total(a), total(b), ("file", "line"), "time_ns", ("host_ns", "device_ns", "ops")
    )
    for r in rows:
        r["file_id"] = file_id(r["file"])
    return rows


def compare_breakdown(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[dict]:
    """Per-step, per-category deltas of two analysis summaries' step-time breakdowns."""
    ba, bb = _breakdown(a), _breakdown(b)
    if ba is None or bb is None:
        return []
    keys = list(dict.fromkeys([*ba, *bb]))
    rows = [{"category": k, "a": ba.get(k, 0), "b": bb.get(k, 0),
             "delta": bb.get(k, 0) - ba.get(k, 0)} for k in keys]  # fmt: skip
    return sorted(rows, key=lambda r: -abs(r["delta"]))


def _breakdown(summary: dict[str, Any] | None) -> dict[str, float] | None:
    if not summary:
        return None
    b = summary.get("breakdown")
    if not isinstance(b, dict):
        return None
    steps = (summary.get("step_stats") or {}).get("count") or 1  # per step, so runs compare
    return {k: v / steps for k, v in b.items() if isinstance(v, (int, float))}


def kernel_table(con) -> pa.Table:
    """Device kernels by name: launches and total time."""
    kinds = ", ".join(f"'{k}'" for k in KERNEL_KINDS)
    return con.sql(
        "SELECT CAST(name AS VARCHAR) AS name, count(*) AS count, sum(dur_ns)::BIGINT AS time_ns "
        f"FROM events WHERE kind IN ({kinds}) GROUP BY 1"
    ).to_arrow_table()


def compare_kernels(a: pa.Table, b: pa.Table) -> list[dict[str, Any]]:
    """Kernel rows keyed by name; the value is the kernel's total device time."""
    return _delta_rows(a, b, ("name",), "time_ns", ("count",))


def compare_findings(a: list[dict] | None, b: list[dict] | None) -> dict[str, Any]:
    """Rules that found something in B and not in A (appeared), in A and not in B (went), and
    in both, with each side's top finding of the rule (titles carry numbers that change, so
    findings match by rule). `available` is false until both analyses are ready."""
    if a is None or b is None:
        return {"available": False, "appeared": [], "went": [], "both": []}
    ta, tb = _top_by_rule(a), _top_by_rule(b)
    return {
        "available": True,
        "appeared": [tb[r] for r in tb if r not in ta],
        "went": [ta[r] for r in ta if r not in tb],
        "both": [{"rule": r, "a": ta[r], "b": tb[r]} for r in tb if r in ta],
    }


def _top_by_rule(found: list[dict]) -> dict[str, dict]:
    top: dict[str, dict] = {}
    for f in found:  # largest saving first already
        top.setdefault(f.get("rule") or "", f)
    return top

"""Automated analysis of a profile: rules that find bottlenecks, the summary, read-only SQL.

The stable Python API (used by the CLI and the web UI):
- `run_rules(profile, ids=None) -> list[Finding]`, ranked by estimated saving;
- `summarize(profile) -> Summary`;
- `run_query(profile, sql, limit, timeout_s) -> QueryResult`;
- `all_rules()` / `get_rule(id)`: the rules (the RULES tuple of analysis/rules). Every record
  has `to_dict()` for JSON.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..model.profile import Profile
from .findings import Evidence, Finding, Hotspot
from .rule import Rule
from .rules import all_rules, get_rule
from .runner import run_rules
from .sql import QueryResult, run_query
from .summary import Summary, summarize

__all__ = [
    "Evidence", "Finding", "Hotspot", "QueryResult", "Rule", "Summary", "all_rules",
    "findings_document", "get_rule", "run_query", "run_rules", "summarize",
]  # fmt: skip


def findings_document(
    profile: Profile, findings: list[Finding], ids: Iterable[str] | None = None
) -> dict:
    """The findings as the one JSON document `analyze --json` prints (docs/agents.md):
    runner.findings_report's."""
    from .runner import findings_report

    return findings_report(profile, ids, findings).to_dict()

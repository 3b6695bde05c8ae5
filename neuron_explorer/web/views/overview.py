"""The profile list, a profile's summary page and its findings: neuron_explorer.analysis
computes them (analysis.overview, summary, runner); these are the routes' adapters, adding
only file ids."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from neuron_explorer.analysis import overview as _overview
from neuron_explorer.analysis.overview import devices, summary_page  # noqa: F401 - routes' name
from neuron_explorer.analysis.page import is_modeled, plain  # noqa: F401 - routes' name
from neuron_explorer.model import Profile

from .source import with_file_ids


def summary_json(
    profile: Profile,
    devs: list[str],
    summary: dict[str, Any] | None,
    findings: list[dict[str, Any]] | None,
    ops: pa.Table,
    lines: pa.Table,
) -> dict[str, Any]:
    """The summary page: analysis.overview.summary_page, its top lines with file ids (the
    findings come with theirs)."""
    doc = summary_page(profile, devs, summary, findings, ops, lines).to_dict()
    with_file_ids(doc["top_lines"])
    return doc


def analysis_summary(profile: Profile) -> dict[str, Any]:
    """neuron_explorer.analysis.summarize(profile) as a JSON-ready dict."""
    from neuron_explorer.analysis import summarize

    return summarize(profile).to_dict()


def analysis_findings(profile: Profile) -> list[dict[str, Any]]:
    """Every rule's findings as dicts, largest saving first."""
    from neuron_explorer.analysis import run_rules

    return [f.to_dict() for f in run_rules(profile)]


def analysis_findings_report(profile: Profile) -> dict[str, Any]:
    """The findings document of every rule (analysis.runner.findings_report)."""
    from neuron_explorer.analysis.runner import findings_report

    return findings_report(profile).to_dict()


def profile_row(name: str, profile: Profile, devs: list[str], findings: list | None) -> dict:
    return _overview.profile_row(name, profile, devs, findings).to_dict()

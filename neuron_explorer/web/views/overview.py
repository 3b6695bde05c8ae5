"""The profile list, a profile's summary page and its findings. Summary and findings come from
neuron_explorer.analysis; this module only assembles them with the manifest and the hot ops and lines."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from neuron_explorer.analysis.overview import summary_page
from neuron_explorer.analysis.page import is_modeled, plain
from neuron_explorer.analysis.steps import profile_steps
from neuron_explorer.model import Profile

from .source import with_file_ids


def step_stats(profile: Profile) -> dict[str, Any]:
    """The summary page's step block: analysis.steps.profile_steps (the one step statistics)
    as the page reads it (count, whole-ns mean and median, each step)."""
    st = profile_steps(profile)
    return {
        "steps": st.count if st else 0,
        "step_ns_mean": int(st.mean_ns) if st else None,
        "step_ns_median": int(st.median_ns) if st else None,
        "per_step": [] if st is None else [plain(s) for s in st.per_step],
    }


def summary_json(
    profile: Profile,
    devices: list[str],
    summary: dict[str, Any] | None,
    findings: list[dict[str, Any]] | None,
    ops: pa.Table,
    lines: pa.Table,
) -> dict[str, Any]:
    """The summary page: analysis.overview.summary_page, its top lines with file ids (the
    findings come with theirs)."""
    doc = summary_page(profile, devices, summary, findings, ops, lines).to_dict()
    with_file_ids(doc["top_lines"])
    return doc


def devices(profile: Profile) -> list[str]:
    """The devices that ran work, sorted. Read with pyarrow (two dictionary columns), so the
    profile list needs neither DuckDB nor the whole events table."""
    import pyarrow.compute as pc

    t = profile.table("events", columns=["layer", "device"])
    found: set[str] = set()
    for layer, device in zip(t["layer"].chunks, t["device"].chunks, strict=True):
        on_device = pc.equal(layer.cast(layer.type.value_type), "device") if len(layer) else None
        if on_device is not None:
            found.update(v for v in pc.unique(device.filter(on_device)).to_pylist() if v)
    return sorted(found)


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
    m = profile.manifest
    stats = step_stats(profile)
    return {
        "name": name,
        "source": m.source,
        "ranks": list(m.ranks),
        "devices": devs,
        "device_spec": (m.device_spec or {}).get("name"),
        "events": m.row_counts.get("events"),
        "steps": stats["steps"],
        "step_ns_mean": stats["step_ns_mean"],
        "top_finding": findings[0] if findings else None,
        "device_time_modeled": is_modeled(profile),
        "error": None,
    }

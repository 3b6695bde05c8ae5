"""The summary page: the manifest's facts, the devices, the step statistics, the analysis
summary, the top findings, ops and lines of one profile, assembled from the page models the
other pages show (the web caches each part per profile)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from ..model.profile import Profile
from .lines import hot_lines
from .operators import operators_page
from .page import PageModel, is_modeled
from .steps import StepStats, profile_steps

TOP_FINDINGS = 5
TOP_OPS = 10
TOP_LINES = 10


@dataclass(frozen=True)
class ManifestInfo:
    """What the manifest says of the run: producer, torch, host, ranks, device spec, counts."""

    source: str
    producer: str
    torch_version: str
    host: str
    ranks: tuple[int, ...]
    device_spec: dict[str, Any] | None
    devices: tuple[dict[str, Any], ...]  # a Kineto trace's deviceProperties
    row_counts: dict[str, int]
    inputs: tuple[str, ...]


def manifest_info(profile: Profile) -> ManifestInfo:
    m = profile.manifest
    return ManifestInfo(m.source, m.producer, m.torch_version, m.host, tuple(m.ranks),
                        m.device_spec, tuple(m.devices), dict(m.row_counts), tuple(m.inputs))  # fmt: skip


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


@dataclass(frozen=True)
class ProfileRow(PageModel):
    """One row of the profile list: what the profile is, its mean step and its top finding."""

    name: str
    source: str
    ranks: tuple[int, ...]
    devices: tuple[str, ...]
    device_spec: str | None  # the modeled chip's name
    events: int | None
    steps: StepStats | None  # the one step statistics, without per_step (the list needs none)
    top_finding: dict[str, Any] | None
    device_time_modeled: bool
    error: str | None = None


def profile_row(
    name: str, profile: Profile, devs: Sequence[str], findings: Sequence[dict] | None
) -> ProfileRow:
    """The list's row of `profile` served as `name`, with its devices and ranked findings."""
    m = profile.manifest
    st = profile_steps(profile)
    return ProfileRow(
        name=name, source=m.source, ranks=tuple(m.ranks), devices=tuple(devs),
        device_spec=m.spec.name, events=m.row_counts.get("events"),
        steps=None if st is None else replace(st, per_step=()),
        top_finding=findings[0] if findings else None, device_time_modeled=is_modeled(profile),
    )  # fmt: skip


@dataclass(frozen=True)
class SummaryPage(PageModel):
    """One profile at a glance. `summary` is analysis.summary's Summary.to_dict() and
    `findings` its top findings, None until the analysis has run."""

    manifest: ManifestInfo
    device_time_modeled: bool
    devices: tuple[str, ...]  # devices that ran work
    steps: StepStats | None
    summary: dict[str, Any] | None
    findings: tuple[dict[str, Any], ...] | None
    findings_total: int | None
    top_ops: tuple[dict[str, Any], ...]
    top_lines: tuple[dict[str, Any], ...]


def summary_page(
    profile: Profile,
    devices: Sequence[str],
    summary: dict[str, Any] | None,
    findings: Sequence[dict[str, Any]] | None,
    ops: pa.Table,
    lines: pa.Table,
) -> SummaryPage:
    """The summary page of `profile` from its parts: the devices that ran work, the summary,
    the ranked findings (dicts), the operator table and the line table."""
    modeled = is_modeled(profile)
    top_ops = operators_page(ops, profile.manifest.device_spec, modeled, TOP_OPS).operators
    return SummaryPage(
        manifest=manifest_info(profile),
        device_time_modeled=modeled,
        devices=tuple(devices),
        steps=profile_steps(profile),
        summary=summary,
        findings=None if findings is None else tuple(findings[:TOP_FINDINGS]),
        findings_total=None if findings is None else len(findings),
        top_ops=top_ops,
        top_lines=tuple(hot_lines(lines, TOP_LINES)),
    )

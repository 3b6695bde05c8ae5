"""The compare page's view: neuron_explorer.analysis.compare computes it; `compare_json` is its
JSON twin (the analysis document with the web's file ids). The other names are one-line
adapters kept for the routes and agents."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from neuron_explorer.analysis import compare as _compare
from neuron_explorer.analysis.compare import (  # noqa: F401 - the routes' names
    Side,
    compare_breakdown,
    compare_kernels,
    compare_ops,
    kernel_table,
)
from neuron_explorer.analysis.hotspots import ModuleNode
from neuron_explorer.analysis.page import is_modeled, plain
from neuron_explorer.analysis.steps import profile_steps
from neuron_explorer.model import Profile

from .source import with_file_ids


def side_of(name: str, profile: Profile, summary: dict[str, Any] | None, ops: pa.Table,
            lines: pa.Table, kernels: pa.Table, modules: list[ModuleNode],
            findings: list[dict[str, Any]] | None) -> Side:  # fmt: skip
    """One side of the comparison from the server's cached parts."""
    return Side(name, profile_steps(profile), summary, ops, lines, kernels,
                tuple(m.to_dict() for m in modules), None if findings is None else tuple(findings),
                is_modeled(profile))  # fmt: skip


def compare_json(a: Side, b: Side) -> dict[str, Any]:
    """/api/compare: B against A, as `neuron-explorer diff --json` prints it, plus file ids."""
    return with_file_ids(_compare.compare(a, b).to_dict())


def compare_lines(a: pa.Table, b: pa.Table) -> list[dict[str, Any]]:
    return with_file_ids(_compare.compare_lines(a, b))


def compare_findings(a: list[dict] | None, b: list[dict] | None) -> dict[str, Any]:
    return with_file_ids(plain(_compare.compare_findings(a, b)))

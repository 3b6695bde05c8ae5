"""The operator page's view: neuron_explorer.analysis.operators computes it (the table, the
roofline, one op's detail); these names stay as one-line adapters for the routes."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from neuron_explorer.analysis.operators import operator_detail as _detail
from neuron_explorer.analysis.operators import (  # noqa: F401 - the routes' name
    operator_table,
    operators_page,
)

from .source import with_file_ids


def operators_json(table: pa.Table, spec: dict[str, Any] | None, modeled: bool) -> dict[str, Any]:
    return operators_page(table, spec, modeled).to_dict()


def operator_detail(con, op: str) -> dict[str, Any]:
    """One op's kernels, instructions and lines, the lines with file ids."""
    return with_file_ids(_detail(con, op).to_dict())

"""The span view (the timeline's range selection): neuron_explorer.analysis.span computes it."""

from __future__ import annotations

from typing import Any

from neuron_explorer.analysis import span as _span
from neuron_explorer.analysis import span_flame as _span_flame


def span_totals(con, start_ns: int, end_ns: int, lanes=None) -> dict[str, Any]:
    return _span.span_totals(con, start_ns, end_ns, lanes).to_dict()


def span_flame(con, start_ns: int, end_ns: int, lanes=None) -> dict[str, Any]:
    return _span_flame.span_flame(con, start_ns, end_ns, lanes).to_dict()

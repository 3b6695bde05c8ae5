"""Two profiles side by side: steps, breakdown, ops, lines, kernels and findings with deltas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Query

from ..pages import Api, Page, Shell
from ..views import compare, overview

if TYPE_CHECKING:
    from ..service import Service


def api_compare(svc: Service, a: str = Query(...), b: str = Query(...)) -> dict[str, Any]:
    pa_, pb_ = svc.store.open(a), svc.store.open(b)
    sa, sb = overview.step_stats(pa_), overview.step_stats(pb_)
    suma, sumb = svc.summary(a), svc.summary(b)
    return {
        "a": a, "b": b,
        "steps": {"a": sa, "b": sb},
        "step_ns_delta": (sb["step_ns_mean"] - sa["step_ns_mean"])
        if sa["step_ns_mean"] is not None and sb["step_ns_mean"] is not None else None,
        "breakdown": compare.compare_breakdown(suma, sumb),
        "ops": compare.compare_ops(svc.ops(a), svc.ops(b))[:200],
        "lines": compare.compare_lines(svc.lines(a), svc.lines(b))[:200],
        "kernels": compare.compare_kernels(svc.kernels(a), svc.kernels(b))[:200],
        "findings": compare.compare_findings(svc.findings(a), svc.findings(b)),
        "device_time_modeled": overview.is_modeled(pa_) or overview.is_modeled(pb_),
    }  # fmt: skip


PAGES = (Page("compare", "/compare", api_compare, Shell("Compare", "compare.js", plotly=True)),)
API: tuple[Api, ...] = ()

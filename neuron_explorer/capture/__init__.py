"""Capture: torch.profiler plus the neuron runtime's events, merged into a profile.

`trace_handler(dir)` is an `on_trace_ready` handler; `profile(...)` a profiler with good
defaults for the neuron device; `run_captured` runs a script unchanged under the profiler.
They load on first use: `neuron-explorer import` reads one function of capture.device_trace
and should not load the capture machinery (nor its libraries) with it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TraceHandler", "profile", "trace_handler"]


def __getattr__(name: str) -> Any:
    if name in ("TraceHandler", "trace_handler"):
        from . import handler

        return getattr(handler, name)
    if name == "profile":
        from .session import profile

        return profile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

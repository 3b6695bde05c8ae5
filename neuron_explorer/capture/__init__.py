"""Capture: torch.profiler plus the neuron runtime's events, merged into a profile.

`trace_handler(dir)` is an `on_trace_ready` handler; `profile(...)` a profiler with good
defaults for the neuron device; `run_captured` runs a script unchanged under the profiler.
"""

from .handler import TraceHandler, trace_handler
from .session import profile

__all__ = ["TraceHandler", "profile", "trace_handler"]

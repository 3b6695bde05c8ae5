"""`neuron_explorer.profile(...)`: torch.profiler.profile with good defaults for the neuron device."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from .handler import trace_handler


def profile(
    dir_name: str | os.PathLike | None = None,
    *,
    wait: int | None = None,
    warmup: int = 1,
    active: int = 3,
    repeat: int = 1,
    worker_name: str | None = None,
    record_shapes: bool = True,
    profile_memory: bool = False,
    activities: Iterable[Any] | None = None,
    schedule: Callable[[int], Any] | None = None,
    on_trace_ready: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """A `torch.profiler.profile` writing profiles to `dir_name` (via `trace_handler`).

    Shapes are recorded; `with_stack` stays off because the neuron runtime captures the exact
    user line of every launch itself, more cheaply. Give `wait` to use a schedule
    (wait/warmup/active/repeat, steps marked with `prof.step()`); without it the whole block is
    recorded as one cycle. Move the model to the device before entering: while shapes are
    recorded, torch.profiler holds weak references to tensors, and `model.to("neuron")` (which
    swaps each parameter for a device tensor) refuses to run.
    """
    import torch.profiler as tp

    if schedule is None and wait is not None:
        schedule = tp.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat)
    if on_trace_ready is None and dir_name is not None:
        on_trace_ready = trace_handler(dir_name, worker_name)
    return tp.profile(
        activities=list(activities) if activities is not None else [tp.ProfilerActivity.CPU],
        schedule=schedule,
        on_trace_ready=on_trace_ready,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        **kwargs,
    )

"""The runtime's view of the cost model: the chip spec, the device timeline and one clock.

Real time spent inside the backend is cut from the host clock and replaced by the modeled
cost of each runtime call; `cut_ns` is the running total, so modeled = real - cut
(docs/architecture.md). Device work is modeled on that same clock, relative to `origin_ns` to
keep integers small.
"""

from __future__ import annotations

import time
from typing import Any

origin_ns = time.time_ns()  # device-clock zero; device times are stored as origin_ns + t
cut_ns = 0  # real backend time minus modeled host cost, summed over runtime calls so far
# real end of the latest recorded call: the round trip cut before the next op fits in the gap
last_end_ns = 0
_timeline: Any = None
# device-relative ns when the collective queue (CC) finishes what runtime/collectives.py put on
# it: collectives overlap compute, and a sync waits for both
collectives_free_ns = 0
_spec: Any = None
# Kernels launched but not yet placed on the timeline, in launch order: lists ending in
# [..., plan, ready_ns, placed] (the raw launch records of record.py; `placed` is
# DeviceTimeline.place's result, None until then): scheduling waits until a sync or a drain
# needs it, with the same result.
_pending: list[list] = []


def spec() -> Any:
    """The active DeviceSpec (NEURON_DEVICE_SPEC, default trn2; `backend.set_device_spec`), its
    host costs measured on this host (runtime/hostcal.py)."""
    global _spec
    if _spec is None:
        from neuron_explorer.backend.costmodel import get_spec
        from neuron_explorer.backend.runtime.hostcal import with_host_costs

        _spec = with_host_costs(get_spec())
    return _spec


def spec_name() -> str:
    try:
        return spec().name
    except Exception:  # noqa: BLE001 - the cost model is optional for the device name
        return "trn2"


def timeline() -> Any:
    """The one DeviceTimeline all launches go to."""
    global _timeline
    if _timeline is None:
        from neuron_explorer.backend.costmodel import DeviceTimeline

        _timeline = DeviceTimeline(spec())
    return _timeline


def set_spec(name: str | None) -> None:
    """Switch the modeled chip (trn1 | trn2 | trn3, or trn2-lnc2 | trn3-lnc2; None: the
    environment's again); the device timeline starts over."""
    global _spec, _timeline
    from neuron_explorer.backend.costmodel import get_spec, set_default_spec
    from neuron_explorer.backend.runtime.hostcal import with_host_costs

    schedule_pending()  # launched kernels run on the chip they were lowered for
    set_default_spec(name)
    _spec, _timeline = with_host_costs(get_spec()), None
    from neuron_explorer.backend.runtime import tracking

    tracking.clear_compile_cache()  # kernels were lowered for the previous chip


def modeled_now(real_ns: int) -> int:
    """A real time.time_ns() reading on the modeled clock (device-relative ns)."""
    return real_ns - cut_ns - origin_ns


def add_cut(real_dur_ns: int, modeled_cost_ns: int) -> int:
    """Account one runtime call; returns the cut before it (for the event)."""
    global cut_ns
    before = cut_ns
    cut_ns += real_dur_ns - modeled_cost_ns
    return before


def schedule_pending() -> None:
    """Place every queued kernel on the device timeline, in launch order."""
    if not _pending:
        return
    cells = _pending[:]
    del _pending[: len(cells)]
    place = timeline().place
    for cell in cells:
        cell[-1] = place(cell[-3], cell[-2])


def device_idle_at() -> int:
    """Device-relative ns when every engine queue is idle."""
    schedule_pending()
    if _timeline is None:
        return collectives_free_ns
    return max(int(_timeline.drain_ns()), collectives_free_ns)

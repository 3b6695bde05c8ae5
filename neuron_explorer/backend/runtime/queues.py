"""The modeled device's queues as torch.neuron's streams (backend/streams.py) and the
collectives (runtime/collectives.py) share them: the engines' queue, which runs every kernel in
launch order (the default stream), and the collective queue, which side streams map to.

`pending` maps the data_ptr of a storage an overlapped collective still reads or writes to when
that collective ends (device ns): a kernel launched on such a buffer starts after it
(record.py). Its key FLOOR is the engines' queue's floor: every kernel launched from now on
starts no earlier (a kernel of the default stream that waited for a collective; the default
stream's `wait_event`). `side` is the current stream when it is a side stream, else None."""

from __future__ import annotations

from typing import Any

from neuron_explorer.backend.runtime import model

pending: dict[int, int] = {}
FLOOR = 0  # no storage has data_ptr 0 (a freed one is never held)
side: Any = None  # set by backend/streams.py
# makes a stream id torch's current one (the C++ guard's, set when runtime/guard.py loads it)
set_native_stream: Any = None


def wait_compute(device_ns: int) -> None:
    """The default stream waits for `device_ns` (an event of a side stream): every kernel
    launched from now on starts no earlier, as a CUDA stream after `wait_event`."""
    if device_ns > pending.get(FLOOR, 0):
        pending[FLOOR] = device_ns


def compute_tail_ns() -> int:
    """When the kernels launched so far end on the engines (device-relative ns)."""
    model.schedule_pending()
    return max(int(model.timeline().drain_ns()), pending.get(FLOOR, 0))

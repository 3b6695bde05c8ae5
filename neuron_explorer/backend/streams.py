"""Streams and events of `torch.neuron`, shaped like torch.cuda's, for code that asks for them
(FSDP2 keeps its all-gathers and reduce-scatters on streams of their own).

The host runs each op to completion in program order, so the data is always ready and an event
is complete once recorded. The modeled device has two kinds of queue: the engines, which run
every kernel of every stream in launch order (the default stream), and the collective queue
(CC). A side stream (any stream but the default one) maps to the collective queue: a collective
issued on it does not block the host even with `async_op=False` (on a GPU it only orders that
stream; runtime/collectives.py), and a stream's *tail* is when the work issued on it ends on the
modeled clock. While a profiler records, an event takes its stream's tail, and `wait_event` /
`wait_stream` order the waiting stream after it: on the default stream, every kernel launched
later starts no earlier (runtime/queues.py); on a side stream, its next collective does.
Events also keep the host time they were recorded at, so `elapsed_time` works.

A `Stream` is a `torch.Stream` (of device type neuron, an id of its own), so torch's own APIs
take it: `torch.accelerator.set_stream`, `tensor.record_stream`, `torch.Stream` arguments.
With the C++ guard, torch's current stream and this module's are the same: a stream made
current here is made current there, and one torch makes current (torch.accelerator.set_stream)
is told to `became_current`.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import queues

_PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, the neuron device's type
_ids = itertools.count(1)  # 0 is the default stream's id, as in c10
_by_id: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()


class Stream(torch.Stream):
    """A neuron stream (the default one: the engines' queue; any other maps to the collective
    queue), whatever its priority."""

    def __new__(cls, device: Any = None, priority: int = 0, *, stream_id: int | None = None,
                **_: Any) -> Stream:  # fmt: skip
        sid = next(_ids) if stream_id is None else stream_id
        return super().__new__(cls, stream_id=sid, device_index=0, device_type=_PRIVATEUSE1)

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.priority = priority
        self.tail_ns = 0  # device ns when the work issued on this side stream ends
        _by_id[self.stream_id] = self

    # torch.neuron's events carry the modeled device time, as torch.cuda's streams take
    # torch.cuda's events
    def wait_event(self, event: Event) -> None:  # type: ignore[override]
        """Work issued on this stream from now on waits for `event` on the modeled device (the
        host has nothing to wait for: the op that recorded it has run)."""
        _order_after(self, event.device_ns)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Work issued on this stream from now on waits for the work issued on `stream`."""
        if _prof._is_profiler_enabled:
            _order_after(self, tail_ns(_ours(stream)))

    def record_event(self, event: Event | None = None) -> Event:  # type: ignore[override]
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _synchronize()


class Event:
    """A neuron event: complete once recorded (the device runs in program order)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:  # fmt: skip
        self.enable_timing = enable_timing
        self._ns: int | None = None
        self.device_ns = 0  # its stream's tail when recorded (while profiling)

    def record(self, stream: Stream | None = None) -> None:
        self._ns = time.perf_counter_ns()
        if _prof._is_profiler_enabled:
            self.device_ns = tail_ns(stream if stream is not None else _current)

    def wait(self, stream: Stream | None = None) -> None:
        """Work issued on `stream` (the current one) from now on waits for this event."""
        _order_after(stream if stream is not None else _current, self.device_ns)

    def query(self) -> bool:
        return self._ns is not None

    def synchronize(self) -> None:
        _synchronize()

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event's record and `end_event`'s, as torch.cuda's."""
        if self._ns is None or end_event._ns is None:
            raise RuntimeError("neuron: elapsed_time of an event that was never recorded")
        return (end_event._ns - self._ns) / 1e6


_default = Stream(stream_id=0)
_current = _default


def current_stream(device: Any = None) -> Stream:
    return _current


def default_stream(device: Any = None) -> Stream:
    return _default


def side_stream() -> Stream | None:
    """The current stream when it is a side stream (mapped to the collective queue), else None."""
    return None if _current is _default else _current


def tail_ns(stream_: Stream) -> int:
    """When the work issued on `stream_` ends on the modeled device (device-relative ns): the
    engines' for the default stream; a side stream's collectives', and the kernels launched
    while it was current (which run on the engines, in launch order)."""
    if stream_ is _default:
        return queues.compute_tail_ns()
    return stream_.tail_ns


def _order_after(stream_: Stream, device_ns: int) -> None:
    if not device_ns:
        return
    if stream_ is _default:
        queues.wait_compute(device_ns)
    else:
        stream_.tail_ns = max(stream_.tail_ns, device_ns)


def _ours(stream_: torch.Stream) -> Stream:
    """This module's Stream for a torch.Stream of the device (one torch made: its own id)."""
    if isinstance(stream_, Stream):
        return stream_
    if stream_.device_type != _PRIVATEUSE1:
        raise ValueError(f"neuron: {stream_} is not a stream of the neuron device")
    found = _by_id.get(stream_.stream_id)
    return found if found is not None else Stream(stream_id=stream_.stream_id)


def _tell_torch(stream_: Stream) -> None:
    if queues.set_native_stream is not None:  # the C++ guard's (runtime/guard.py sets it)
        queues.set_native_stream(stream_.stream_id)


def _make_current(stream_: Stream) -> None:
    global _current
    _leave(_current)
    _current = stream_
    queues.side = side_stream()


def became_current(stream_id: int) -> None:
    """torch made the stream `stream_id` current (torch.accelerator.set_stream, a guard)."""
    found = _by_id.get(stream_id)
    _make_current(found if found is not None else Stream(stream_id=stream_id))


def set_stream(stream_: torch.Stream) -> None:
    ours = _ours(stream_)
    _make_current(ours)
    _tell_torch(ours)


@contextlib.contextmanager
def stream(stream_: torch.Stream | None) -> Iterator[None]:
    """Make `stream_` current inside the block (None keeps the current one)."""
    before = _current
    if stream_ is not None:
        set_stream(stream_)
    try:
        yield
    finally:
        set_stream(before)


def _leave(stream_: Stream) -> None:
    """A side stream made current no longer: its tail covers the kernels launched on it, which
    the engines run in launch order (so no later than the engines' tail now)."""
    if stream_ is not _default and _prof._is_profiler_enabled:
        stream_.tail_ns = max(stream_.tail_ns, queues.compute_tail_ns())


def _synchronize() -> None:
    """torch.neuron.synchronize() (the one in-order queue), without importing device_module,
    which imports this module."""
    from neuron_explorer.backend.runtime.dispatch import record_sync

    record_sync("torch.neuron.synchronize", None)

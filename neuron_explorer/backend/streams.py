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
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import queues


class Stream:
    """A neuron stream (the default one: the engines' queue; any other maps to the collective
    queue), whatever its priority."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.priority = priority
        self.tail_ns = 0  # device ns when the work issued on this side stream ends

    @property
    def device(self) -> torch.device:  # made when asked: "neuron" exists only once registered
        return torch.device("neuron", 0)

    def wait_event(self, event: Event) -> None:
        """Work issued on this stream from now on waits for `event` on the modeled device (the
        host has nothing to wait for: the op that recorded it has run)."""
        _order_after(self, event.device_ns)

    def wait_stream(self, stream: Stream) -> None:
        """Work issued on this stream from now on waits for the work issued on `stream`."""
        if _prof._is_profiler_enabled:
            _order_after(self, tail_ns(stream))

    def record_event(self, event: Event | None = None) -> Event:
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


_default = Stream()
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


def set_stream(stream_: Stream) -> None:
    global _current
    _leave(_current)
    _current = stream_
    queues.side = side_stream()


@contextlib.contextmanager
def stream(stream_: Stream | None) -> Iterator[None]:
    """Make `stream_` current inside the block (None keeps the current one)."""
    global _current
    before = _current
    if stream_ is not None:
        _current = stream_
        queues.side = side_stream()
    try:
        yield
    finally:
        _leave(_current)
        _current = before
        queues.side = side_stream()


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

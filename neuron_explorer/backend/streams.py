"""Streams and events of `torch.neuron`, shaped like torch.cuda's, for code that asks for them
(FSDP2 keeps its all-gathers and reduce-scatters on streams of their own).

The modeled device runs each op to completion in program order on the host, so every stream is
the one queue: waiting on an event or a stream has nothing to wait for, and an event is complete
once recorded. Events keep the host time they were recorded at, so `elapsed_time` works.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch


class Stream:
    """A neuron stream: the device's one queue, whatever its priority."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.priority = priority

    @property
    def device(self) -> torch.device:  # made when asked: "neuron" exists only once registered
        return torch.device("neuron", 0)

    def wait_event(self, event: Event) -> None:
        """Nothing to wait for: the op that recorded `event` has run."""

    def wait_stream(self, stream: Stream) -> None:
        """Nothing to wait for: every stream is the one queue."""

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _synchronize()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return hash("neuron-stream")


class Event:
    """A neuron event: complete once recorded (the device runs in program order)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:  # fmt: skip
        self.enable_timing = enable_timing
        self._ns: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        self._ns = time.perf_counter_ns()

    def wait(self, stream: Stream | None = None) -> None:
        """Nothing to wait for."""

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


def set_stream(stream_: Stream) -> None:
    global _current
    _current = stream_


@contextlib.contextmanager
def stream(stream_: Stream | None) -> Iterator[None]:
    """Make `stream_` current inside the block (None keeps the current one)."""
    global _current
    before = _current
    if stream_ is not None:
        _current = stream_
    try:
        yield
    finally:
        _current = before


def _synchronize() -> None:
    """torch.neuron.synchronize() (the one in-order queue), without importing device_module,
    which imports this module."""
    from neuron_explorer.backend.runtime.dispatch import record_sync

    record_sync("torch.neuron.synchronize", None)

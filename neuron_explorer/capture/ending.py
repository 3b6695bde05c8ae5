"""What ended a captured run early: the exception, the aten op it was in, and the user's line.

A run that dies inside an op still writes the steps it recorded (torch.profiler's `__exit__`
hands the cycle to `on_trace_ready`, and `capture` writes what it has). Without a word on why
it stopped, that partial profile reads like a clean run ("CPU fallbacks: none"); so the
profile's manifest records `extra["run_ended"]` and the summary shows it.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..vocab.frames import is_user_file


def run_ended(exc: BaseException) -> dict[str, Any]:
    """{exception, message, op, file, line, function, unix_ns} of an exception that ended the
    run; op and the line are None where the traceback has none (an error raised outside any
    neuron op). `unix_ns` (when it ended) tells a job's first failure from the errors it caused
    in the other ranks (model/combine.py)."""
    text = str(exc).strip().splitlines()
    record: dict[str, Any] = {
        "exception": type(exc).__name__,
        "message": text[0][:500] if text else "",
        "op": None,
        "file": None,
        "line": None,
        "function": None,
        "unix_ns": time.time_ns(),
    }
    tb = exc.__traceback__
    while tb is not None:  # outermost first: the last user frame and the last op win
        frame = tb.tb_frame
        code = frame.f_code
        if is_user_file(code.co_filename):
            record.update(file=code.co_filename, line=tb.tb_lineno, function=code.co_name)
        op = _op_of(frame)
        if op is not None:
            record["op"] = op
        tb = tb.tb_next
    return record


def _op_of(frame) -> str | None:
    """The aten op a neuron runtime frame was running (its `info`, a dispatch.OpInfo)."""
    if not frame.f_code.co_filename.endswith(("dispatch.py", "record.py", "kernels.py")):
        return None
    info = frame.f_locals.get("info")
    name = getattr(info, "name", None)
    return name if isinstance(name, str) and name.startswith("aten::") else None


def exiting_exception() -> BaseException | None:
    """The exception that is ending a `with torch.profiler.profile(...)` block, when called
    (through on_trace_ready) from that profiler's `__exit__`; None otherwise."""
    exc = sys.exc_info()[1]
    if exc is None or isinstance(exc, (StopIteration, GeneratorExit)):
        return None
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__exit__" and "profiler" in code.co_filename:
            return exc
        frame = frame.f_back
    return None


@contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Hold off SIGTERM while a profile is written: when one rank of a torchrun job dies, the
    launcher sends SIGTERM to the others at once (and SIGKILL only 30 s later), which would
    kill a surviving rank in the middle of writing the part that records why it stopped. The
    signal is raised again, to its own handler, once the part is written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if got:
            signal.raise_signal(signal.SIGTERM)

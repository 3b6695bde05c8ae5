"""Kineto's `USDT: ... profiler_start` / `profiler_stop` lines, kept out of a captured run's stderr.

Kineto writes them from C++ straight to file descriptor 2 whenever a trace starts or stops, that
is inside the profiler's start, step and stop. Only around those calls is descriptor 2 pointed at
a temporary file; afterwards every other line written meanwhile (the script's on_trace_ready
output, torch's warnings) is passed on unchanged, in order. The script's stderr at any other
moment never goes through here.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

USDT_LINE = re.compile(rb"^USDT:.*\bprofiler_(start|stop)\s*$")
_depth = 0  # nested uses (a profiler step inside a handler) filter once, at the outermost


def without_usdt_lines(data: bytes) -> bytes:
    """`data` less the lines Kineto writes when a trace starts or stops."""
    return b"".join(
        line for line in data.splitlines(keepends=True) if not USDT_LINE.match(line.rstrip(b"\n"))
    )


def _held_file():  # -> a binary file object
    try:
        return tempfile.TemporaryFile()
    except OSError:
        return tempfile.TemporaryFile(dir="/tmp" if os.path.isdir("/tmp") else os.getcwd())


@contextmanager
def kineto_lines_filtered() -> Iterator[None]:
    """Run the block with descriptor 2 captured, then write it back without Kineto's lines."""
    global _depth
    if _depth:
        yield
        return
    try:
        sys.stderr.flush()
        # an anonymous file for what is written meanwhile; the system's /tmp when the script
        # deleted its own temporary directory (tempfile.tempdir), and none at all without it
        held = _held_file()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 (a closed stderr), no file: nothing to filter
        yield
        return
    _depth += 1
    try:
        with held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            finally:
                try:
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
                os.dup2(saved, 2)
                held.seek(0)
                kept = without_usdt_lines(held.read())
                while kept:
                    kept = kept[os.write(2, kept) :]
    finally:
        os.close(saved)
        _depth -= 1

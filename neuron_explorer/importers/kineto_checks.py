"""The checks that turn a trace's bad times into one line naming the file (BadInputError)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import BadInputError
from .kineto_extract import Decoded

MAX_BASE_NS = 2**62  # the year 2116; room left for the trace's own times in int64
CHECK_BLOCK = 1 << 20  # rows checked at once: the checks' temporaries stay a few MB


def check_times(path: Path, d: Decoded, rows: np.ndarray, bad: np.ndarray, what: str) -> None:
    """Raise for the first of `rows` whose time value `what` is missing or not a number."""
    if bad.any():
        i = int(rows[int(np.argmax(bad))])
        name = d.name_list[d.name_code[i]]
        raise BadInputError(
            path, f"event #{i} ({name!r}, ph {str(d.ph[i])!r}) has no {what!r} time"
        )


def check_range(
    path: Path, d: Decoded, rows: np.ndarray, start: np.ndarray, dur: np.ndarray
) -> None:
    """Raise for the first of `rows` whose time cannot be a unix time in int64 nanoseconds:
    ts or dur out of range, or start or end (base time added) beyond +-2**62 ns."""
    for lo in range(0, len(rows), CHECK_BLOCK):
        block = slice(lo, lo + CHECK_BLOCK)
        _check_range(path, d, rows[block], start[block], dur[block])


def _check_range(
    path: Path, d: Decoded, rows: np.ndarray, start: np.ndarray, dur: np.ndarray
) -> None:
    bad = d.ts.out_of_range[rows] | d.dur.out_of_range[rows]
    bad |= (np.abs(start) >= MAX_BASE_NS) | (np.abs(start + dur) >= MAX_BASE_NS)
    if bad.any():
        i = int(rows[int(np.argmax(bad))])
        name = d.name_list[d.name_code[i]]
        raise BadInputError(
            path,
            f"event #{i} ({name!r}, ph {str(d.ph[i])!r}) has a time out of range (ts or "
            "ts + dur beyond the year 2116 as unix time; times are microseconds)",
        )

"""Traces of several ranks must come from one run before they are merged into one profile.

Two signs of different runs, each refused with a line naming both files unless the user says
`--mixed-runs`: a different `distributedInfo.world_size`, and time spans that do not overlap at
all (the ranks of one job profile the same steps at the same time; a gap between two traces
means two runs, such as yesterday's rank 0 beside today's rank 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import BadInputError

HINT = "traces of different runs; pass --mixed-runs to merge them anyway"


def check_one_run(files: Sequence[Any]) -> None:
    """Raise BadInputError when the files (importers.kineto.FileData) are not of one run."""
    if len(files) < 2:
        return
    sized = [(f, f.meta.get("distributed", {}).get("world_size")) for f in files]
    sized = [(f, w) for f, w in sized if isinstance(w, int)]
    for f, w in sized[1:]:
        first, w0 = sized[0]
        if w != w0:
            raise BadInputError(f.path, f"world size {w}, but {first.path} has {w0}: {HINT}")
    found = [(s[0], s[1], f) for f in files if (s := _span(f)) is not None]
    spans = sorted(found, key=lambda x: (x[0], x[1]))
    if not spans:
        return
    _, reach, owner = spans[0]
    for start, end, f in spans[1:]:
        if start > reach:
            gap_s = (start - reach) / 1e9
            raise BadInputError(f.path, f"starts {gap_s:.1f} s after {owner.path} ended: {HINT}")
        if end > reach:
            reach, owner = end, f


def _span(f: Any) -> tuple[int, int] | None:
    start = f.columns["start_ns"]
    if not len(start):
        return None
    end = start + f.columns["dur_ns"]
    return int(start.min()), int(end.max())

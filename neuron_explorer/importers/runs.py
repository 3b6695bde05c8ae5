"""Traces of several ranks must come from one run before they are merged into one profile.

Two signs of different runs, each refused with a line naming both files unless the user says
`--mixed-runs`: a different `distributedInfo.world_size`, and time spans that do not overlap at
all (the ranks of one job profile the same steps at the same time; a gap between two traces
means two runs, such as yesterday's rank 0 beside today's rank 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInputError

HINT = "traces of different runs; pass --mixed-runs to merge them anyway"


@dataclass(frozen=True)
class RunFacts:
    """What the checks read of one trace file: its world size and time span (unix ns)."""

    path: Path
    world_size: int | None
    span: tuple[int, int] | None


def facts_of(path: Path, meta: dict[str, Any], start_ns: Any, dur_ns: Any) -> RunFacts:
    """A file's facts from its meta and its rows' start and duration columns (numpy)."""
    span = (int(start_ns.min()), int((start_ns + dur_ns).max())) if len(start_ns) else None
    return RunFacts(path, world_size_of(meta), span)


def world_size_of(meta: dict[str, Any]) -> int | None:
    """A trace's distributedInfo.world_size (importers.kineto.FileData.meta), if an integer."""
    size = meta.get("distributed", {}).get("world_size")
    return size if isinstance(size, int) else None


def check_one_run(files: Sequence[Any]) -> None:
    """Raise BadInputError when the files (importers.kineto.FileData) are not of one run."""
    check_facts([facts_of(f.path, f.meta, f.columns["start_ns"], f.columns["dur_ns"])
                 for f in files])  # fmt: skip


def check_world_sizes(files: Sequence[RunFacts]) -> None:
    """Raise BadInputError at the first file whose world size is not the first sized file's."""
    sized = [f for f in files if f.world_size is not None]
    for f in sized[1:]:
        if f.world_size != sized[0].world_size:
            first = sized[0]
            raise BadInputError(
                f.path,
                f"world size {f.world_size}, but {first.path} has {first.world_size}: {HINT}",
            )


def check_facts(files: Sequence[RunFacts]) -> None:
    """Raise BadInputError when the files' facts are not of one run."""
    if len(files) < 2:
        return
    check_world_sizes(files)
    spans = sorted(((*f.span, f) for f in files if f.span is not None), key=lambda x: x[:2])
    if not spans:
        return
    _, reach, owner = spans[0]
    for start, end, f in spans[1:]:
        if start > reach:
            gap_s = (start - reach) / 1e9
            raise BadInputError(f.path, f"starts {gap_s:.1f} s after {owner.path} ended: {HINT}")
        if end > reach:
            reach, owner = end, f

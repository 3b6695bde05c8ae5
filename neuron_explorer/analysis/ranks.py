"""The summary's per-rank table: each rank's steps side by side, and the spread across ranks.

Nothing here sums ranks: a job's ranks run at the same time, so their times are compared, never
added. Per rank: its steps, their median time, and over its steps the device compute, the
communication (modeled transfer of collectives, or collective kernels), the time it waited for
the last rank at collectives, the device idle time, and the communication hidden under compute
with its share of all communication (`overlap`: HTA's comm/compute overlap, the time collectives
run while compute kernels run over the collectives' time, within the steps). The spread of a
column is its largest rank value over its smallest.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pyarrow as pa

from .collectives import rank_step_waits
from .context import AnalysisContext


@dataclass(frozen=True)
class RankRow:
    rank: int
    steps: int
    median_step_ns: int
    compute_ns: int
    communication_ns: int
    wait_ns: int
    idle_ns: int
    comm_overlap_ns: int = 0  # collectives' time under compute kernels
    overlap: float | None = None  # comm_overlap_ns over all collective time; None without any


@dataclass(frozen=True)
class RankSpread:
    """Largest over smallest rank value (1.0 = even); None where the smallest is 0."""

    median_step: float | None
    compute: float | None
    wait: float | None


@dataclass(frozen=True)
class Ranks:
    rows: tuple[RankRow, ...]
    spread: RankSpread


def rank_table(ctx: AnalysisContext, steps: pa.Table) -> Ranks | None:
    """The per-rank table of a profile of several ranks with steps (None otherwise)."""
    if len(ctx.manifest.ranks) < 2 or not steps.num_rows:
        return None
    waits = {r: sum(s.wait_ns for s in v) for r, v in rank_step_waits(ctx).items()}
    rows = []
    for rank in sorted(set(steps.column("rank").to_pylist())):
        mine = [r for r in steps.to_pylist() if r["rank"] == rank]

        def total(col: str, mine: list = mine) -> int:
            return int(sum(r.get(col) or 0 for r in mine))

        hidden, exposed = total("comm_overlap_ns"), total("communication_ns")

        rows.append(
            RankRow(
                rank=int(rank),
                steps=len(mine),
                median_step_ns=int(statistics.median(r["dur_ns"] for r in mine)),
                compute_ns=total("device_compute_ns"),
                communication_ns=total("communication_ns"),
                wait_ns=int(waits.get(rank, 0)),
                idle_ns=total("device_idle_ns"),
                comm_overlap_ns=hidden,
                overlap=round(hidden / (hidden + exposed), 4) if hidden + exposed else None,
            )
        )
    return Ranks(
        rows=tuple(rows),
        spread=RankSpread(
            median_step=_spread([r.median_step_ns for r in rows]),
            compute=_spread([r.compute_ns for r in rows]),
            wait=_spread([r.wait_ns for r in rows]),
        ),
    )


def _spread(values: list[int]) -> float | None:
    low = min(values)
    return round(max(values) / low, 3) if low > 0 else None

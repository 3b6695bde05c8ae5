"""The summary's per-rank table: each rank's steps side by side, and the spread across ranks.

Nothing here sums ranks: a job's ranks run at the same time, so their times are compared, never
added. Per rank: its steps, their median time, the device compute its steps launched (whenever
its device ran it: a host that runs ahead of its device, as FSDP2's does, would keep less of it
inside its step windows than a symmetric peer; its windows' compute where kernels carry no
step), and over its steps the communication (modeled transfer of collectives, or collective
kernels), the time it waited for the other ranks (analysis/collectives.py: its host blocked
while a collective waited for the last rank), the device idle time, and HTA's comm/compute
overlap (`overlap`: the time its collectives run while its compute kernels run, over its
collectives' time, within the steps). As HTA times an NCCL kernel from its launch, spin-wait
included, a neuron collective counts here from when this rank's collective queue could start it,
its wait for the last rank included: the first rank to arrive computes under its wait. The
spread of a column is its largest rank value over its smallest."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pyarrow as pa

from .collectives import collectives, rank_step_waits
from .context import AnalysisContext
from .conventions import COMPUTE_KINDS, sql_list
from .intervals import length_by_rank


@dataclass(frozen=True)
class RankRow:
    rank: int
    steps: int
    median_step_ns: int
    compute_ns: int
    communication_ns: int
    wait_ns: int
    idle_ns: int
    comm_overlap_ns: int = 0  # collectives' time under compute kernels (HTA's spans: hta_overlap)
    overlap: float | None = None  # comm_overlap_ns over the collectives' time; None without any


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
    hta = hta_overlap(ctx, steps)
    launched = launched_compute(ctx, steps)
    rows = []
    by_rank: dict[int, list[dict]] = {}  # each rank's steps, grouped in one pass
    for r in steps.to_pylist():
        by_rank.setdefault(r["rank"], []).append(r)
    for rank in sorted(by_rank):
        mine = by_rank[rank]

        def total(col: str, mine: list = mine) -> int:
            return int(sum(r.get(col) or 0 for r in mine))

        hidden, comm = hta.get(int(rank), (0, 0))

        rows.append(
            RankRow(
                rank=int(rank),
                steps=len(mine),
                median_step_ns=int(statistics.median(r["dur_ns"] for r in mine)),
                compute_ns=launched.get(int(rank), total("device_compute_ns")),
                communication_ns=total("communication_ns"),
                wait_ns=int(waits.get(rank, 0)),
                idle_ns=total("device_idle_ns"),
                comm_overlap_ns=hidden,
                overlap=round(hidden / comm, 4) if comm else None,
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


LAUNCHED = f"""SELECT x.rank, x.start_ns AS s, x.start_ns + x.dur_ns AS e
FROM ev x JOIN rank_steps w ON w.rank = x.rank AND w.step = x.step
WHERE x.layer = 'device' AND x.kind IN {sql_list(COMPUTE_KINDS)}"""


def launched_compute(ctx: AnalysisContext, steps: pa.Table) -> dict[int, int]:
    """rank -> the time of the device compute its steps launched (merged), for the ranks whose
    kernels carry their launching step."""
    merged = ctx.merge(LAUNCHED, rank_steps=steps.select(["rank", "step"]))
    return length_by_rank(merged)


def hta_overlap(ctx: AnalysisContext, steps: pa.Table) -> dict[int, tuple[int, int]]:
    """rank -> (time its collectives run under its compute kernels, its collectives' time), both
    within its steps, a collective counted from when its queue could start it (HTA's span)."""
    import numpy as np

    from ..vocab.intervals import merge_arrays

    cols = ctx.cols
    compute = ctx.device_rows(COMPUTE_KINDS)
    rank_col = cols.ints("rank")
    ks, ke = cols.ints("start_ns")[compute], cols.end()[compute]
    kr = rank_col[compute]
    out = {}
    spans = [(c.rank, c.start_ns - (c.wait_ns if c.recorded else 0),
              c.start_ns + c.transfer_ns if c.recorded else c.start_ns + c.wait_ns)
             for c in collectives(ctx)]  # fmt: skip
    spans_of: dict[int, list[tuple[int, int]]] = {}
    for r, a, b in spans:
        spans_of.setdefault(r, []).append((a, b))
    windows: dict[int, list[dict]] = {}
    for w in steps.to_pylist():
        windows.setdefault(w["rank"], []).append(w)
    order = np.argsort(kr, kind="stable")  # each rank's compute rows, in their order
    rows_of = _split_by(kr[order], order)
    for rank in sorted(windows):
        mine = np.array(spans_of.get(rank, []), np.int64).reshape(-1, 2)
        if not len(mine):
            continue
        _, cs, ce = merge_arrays(np.zeros(len(mine), np.int64), mine[:, 0], mine[:, 1])
        m = rows_of.get(rank, np.zeros(0, np.int64))
        _, us, ue = merge_arrays(np.zeros(len(m), np.int64), ks[m], ke[m])
        hidden = comm = 0
        for w in windows[rank]:
            lo, hi = int(w["start_ns"]), int(w["start_ns"]) + int(w["dur_ns"])
            c = [(max(a, lo), min(b, hi)) for a, b in zip(cs, ce, strict=True) if a < hi and b > lo]
            comm += sum(b - a for a, b in c)
            hidden += sum(_covered(us, ue, a, b) for a, b in c)
        out[int(rank)] = (int(hidden), int(comm))
    return out


def _split_by(keys, rows) -> dict:
    """key -> its `rows` (`keys` sorted, beside them)."""
    import numpy as np

    uniq, first = np.unique(keys, return_index=True)
    ends = np.append(first[1:], len(keys))
    return {int(k): rows[a:b] for k, a, b in zip(uniq, first, ends, strict=True)}


def _covered(s, e, lo: int, hi: int) -> int:
    """Time the disjoint sorted intervals (s, e) cover inside [lo, hi)."""
    import numpy as np

    i, j = np.searchsorted(e, lo, "right"), np.searchsorted(s, hi, "left")
    return int(np.sum(np.minimum(e[i:j], hi) - np.maximum(s[i:j], lo))) if i < j else 0


def _spread(values: list[int]) -> float | None:
    low = min(values)
    return round(max(values) / low, 3) if low > 0 else None

"""The step-time breakdown: one partition of every step window into what the device did and,
while it was idle, what the host was doing, plus the overlaps shown apart (HTA's temporal
breakdown splits a rank's time the same way: compute, non-compute, idle).

Per step window W (a rank's ProfilerStep span, or its whole span without steps):

    device_compute_ns  |W ∩ compute kernels|
    communication_ns   |W ∩ collectives| not hidden under compute
    dma_ns             |W ∩ transfers| not under kernels or collectives
    idle_*_ns          the rest of W, by what the host was doing then, the first cause of
                       IDLE_CAUSES that covers the instant: compiling, in a CPU fallback,
                       waiting in a sync, waiting at a collective for the other ranks,
                       loading data, anything else (launching, Python)

They add up to the step exactly. Shown apart, never added: collectives hidden under compute,
and host compile / fallback / sync time while the device works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..vocab.kinds import FRAMEWORK_KINDS
from . import intervals
from .conventions import (
    COMMUNICATION_KINDS,
    COMPUTE_KINDS,
    DATALOADER_LIKE,
    DEVICE_WORK_KINDS,
    NEURON_SYNC_KIND,
    SYNC_RUNTIME_NAMES,
    TRACE_COMPILE_NAMES,
)

if TYPE_CHECKING:
    from .context import AnalysisContext

# host causes of device idle time, most specific first: an instant in two of them is the first's
IDLE_CAUSES = ("compile", "fallback", "sync", "collective", "dataload")
PARTITION_COLUMNS = (
    "device_compute_ns", "communication_ns", "dma_ns", "idle_compile_ns", "idle_fallback_ns",
    "idle_sync_ns", "idle_collective_ns", "idle_dataload_ns", "idle_host_ns",
)  # fmt: skip
# a neuron collective's host call (its wait for the last rank is in it), or a host library's
# collective span (gloo:* / nccl:* record_functions of other traces)
COLLECTIVE_CALL_LIKE = ("c10d::%", "_c10d_functional::%")
OVERLAP_COLUMNS = (
    "comm_overlap_ns", "compile_overlap_ns", "fallback_overlap_ns", "sync_overlap_ns",
)  # fmt: skip
DEVICE_COLUMNS = ("device_compute_ns", "communication_ns", "dma_ns", "comm_overlap_ns")

Spans = tuple[np.ndarray, np.ndarray, np.ndarray]  # rank, start, end


def host_cause_rows(ctx: AnalysisContext) -> dict[str, np.ndarray]:
    """Row masks of the host events behind each idle cause (as `explained` in context.py)."""
    cols = ctx.cols
    where = cols.where
    host = where("layer", ("host",))
    spans = where("kind", FRAMEWORK_KINDS)
    return {
        "compile": host
        & (where("kind", ("compile",)) | (spans & where("name", TRACE_COMPILE_NAMES))),
        "fallback": host & where("kind", ("fallback",)),
        "sync": host
        & (
            where("kind", (NEURON_SYNC_KIND,))
            | (where("kind", ("runtime",)) & where("name", SYNC_RUNTIME_NAMES))
        ),
        "collective": host
        & (
            (where("kind", ("runtime",)) & cols.like("name", COLLECTIVE_CALL_LIKE))
            | where("kind", ("collective",))
        ),
        "dataload": host & spans & cols.like("name", DATALOADER_LIKE),
    }


def per_step(ctx: AnalysisContext, windows: pa.Table) -> dict[str, np.ndarray]:
    """The partition and overlap columns (int64 arrays, one value per row of `windows`: rank,
    ws, we) of each step window. Device columns are computed for every rank (0 without device
    work); the caller makes them NULL there."""
    cols = ctx.cols
    rank, s, e = cols.ints("rank"), cols.ints("start_ns"), cols.end()

    def spans(mask: np.ndarray) -> Spans:
        return rank[mask], s[mask], e[mask]

    def cover(*parts: Spans) -> np.ndarray:
        r = np.concatenate([p[0] for p in parts])
        lo = np.concatenate([p[1] for p in parts])
        hi = np.concatenate([p[2] for p in parts])
        if not len(r):
            return np.zeros(windows.num_rows, dtype=np.int64)
        rows, ms, me = intervals.merge_arrays(r, lo, hi)
        merged = pa.table({"rank": pa.array(r[rows], pa.int64()), "s": ms, "e": me})
        w = windows.set_column(0, "rank", windows["rank"].cast(pa.int64()))
        return intervals.covered(merged, ["rank"], w)

    compute = spans(ctx.device_rows(COMPUTE_KINDS))
    comm = spans(ctx.device_rows(COMMUNICATION_KINDS))
    busy = spans(ctx.device_rows(DEVICE_WORK_KINDS))
    causes = {k: spans(m) for k, m in host_cause_rows(ctx).items()}

    n_busy, n_comp, n_comm = cover(busy), cover(compute), cover(comm)
    n_kernels = cover(compute, comm)
    step = windows["we"].to_numpy().astype(np.int64) - windows["ws"].to_numpy().astype(np.int64)
    out = {
        "device_compute_ns": n_comp,
        "communication_ns": n_kernels - n_comp,
        "dma_ns": n_busy - n_kernels,
        "comm_overlap_ns": n_comm - (n_kernels - n_comp),
    }
    # idle time inside the union of the first k causes: |W ∩ (U_k ∪ busy)| - |W ∩ busy|
    # (a cause without spans adds nothing to a union: its merge of every busy span is skipped)
    so_far: list[Spans] = []
    claimed = np.zeros(windows.num_rows, dtype=np.int64)
    for cause in IDLE_CAUSES:
        so_far.append(causes[cause])
        idle_in = cover(busy, *so_far) - n_busy if len(causes[cause][0]) else claimed
        out[f"idle_{cause}_ns"] = idle_in - claimed
        claimed = idle_in
    out["idle_host_ns"] = step - n_busy - claimed
    # host time in a cause while the device works: |X| + |busy| - |X ∪ busy|
    for cause in ("compile", "fallback", "sync"):
        x = causes[cause]
        out[f"{cause}_overlap_ns"] = (
            cover(x) + n_busy - cover(x, busy) if len(x[0]) else np.zeros_like(n_busy)
        )
    return out

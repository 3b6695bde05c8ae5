"""`summarize(profile)`: what ran where and where each step's time went, as dataclasses and
Arrow tables (the `summary` command and the web UI's summary page both render it)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.excerpt import scope_of
from ..model.profile import Profile
from . import intervals
from .breakdown import OVERLAP_COLUMNS, PARTITION_COLUMNS
from .columns import dense, exact_sum, group_sum
from .context import AnalysisContext, context
from .conventions import (
    COMMUNICATION_KINDS,
    COMPUTE_KINDS,
    DEVICE_WORK_KINDS,
    KERNEL_KINDS,
    TRANSFER_KINDS,
)
from .engines import EngineUtil, engines, mbu, mfu
from .job import JobEnding, job_ending
from .operators import operator_table, top_host_ops
from .ranks import Ranks, rank_table
from .readiness import Readiness, readiness
from .steps import StepStats, StepTime, step_stats

TOP_N = 15
BREAKDOWN_COLUMNS = (
    "device_compute_ns", "dma_ns", "device_idle_ns", "compile_ns", "fallback_ns", "sync_ns",
    "host_other_ns",
)  # fmt: skip
# the partition's rows: (column, label with device work, label without)
PART_LABELS = {
    "device_compute_ns": ("device compute", None),
    "communication_ns": ("communication (not hidden by compute)", None),
    "dma_ns": ("transfers only (DMA, memcpy, memset)", None),
    "idle_compile_ns": ("device idle: host compiling", "compiling"),
    "idle_fallback_ns": ("device idle: CPU fallback", "CPU fallback"),
    "idle_sync_ns": ("device idle: host in a sync", "sync wait"),
    "idle_collective_ns": (
        "device idle: host at a collective (waiting for the other ranks)",
        "collective wait",
    ),
    "idle_dataload_ns": ("device idle: data loading", "data loading"),
    "idle_host_ns": ("device idle: other host work (launches, Python)", "other host work"),
}
OVERLAP_LABELS = {
    "comm_overlap_ns": "communication hidden under compute",
    "compile_overlap_ns": "host compiling while the device works",
    "fallback_overlap_ns": "CPU fallback while the device works",
    "sync_overlap_ns": "host waiting in a sync while the device works",
}


@dataclass(frozen=True)
class DeviceStats:
    """One device of one rank: how much work it ran and how long it was busy and idle, by HTA's
    definitions (its temporal breakdown):

    busy_ns is the union of all its work (kernels, copies, DMA, collectives); compute_ns the
    union of its compute kernels, communication (collectives, NCCL/gloo kernels) left out, as
    HTA does; communication_ns the union of its collectives; idle_ns its active window (first
    work start to last work end, window_ns) minus busy_ns. The step breakdown counts idle time
    inside the steps instead, so the two differ by the window's time outside steps."""

    rank: int
    device: str
    kernels: int
    collectives: int
    transfers: int
    busy_ns: int
    compute_ns: int
    window_ns: int
    idle_ns: int
    communication_ns: int = 0


@dataclass(frozen=True)
class Part:
    """One row of the breakdown: a column of the per-step table, its label, its time."""

    key: str
    label: str
    ns: int


@dataclass(frozen=True)
class Breakdown:
    """Step time summed over all profiled steps. `parts` is THE breakdown: one partition of the
    steps (device compute, communication, transfers, then device idle time by what the host was
    doing; analysis/breakdown.py) whose ns add up to steps_ns exactly; `overlap` is shown apart
    (collectives under compute, host compile/fallback/sync while the device works), never added.
    The fields below are the per-kind totals the parts come from: device columns are None
    without device work; compile/fallback/sync are host events clipped to the steps and
    host_other the rest of the steps."""

    steps_ns: int
    device_compute_ns: int | None
    dma_ns: int | None
    device_idle_ns: int | None
    compile_ns: int
    fallback_ns: int
    sync_ns: int
    host_other_ns: int
    parts: tuple[Part, ...] = ()
    overlap: tuple[Part, ...] = ()
    communication_ns: int | None = None


@dataclass(frozen=True)
class Summary:
    profile: str
    source: str
    ranks: tuple[int, ...]
    n_events: int
    wall_ns: int
    devices: tuple[DeviceStats, ...]
    step_stats: StepStats | None  # None when the profile has no ProfilerStep spans
    breakdown: Breakdown
    steps: pa.Table  # per step: rank, step, start_ns, dur_ns, the Breakdown columns, kernels
    top_ops_self: pa.Table  # host ops: name, calls, self_ns, total_ns
    top_ops_total: pa.Table
    top_kernels: pa.Table  # device kernels: name, device, calls, total_ns, mean_ns, share
    engines: tuple[EngineUtil, ...]
    mfu: float | None  # neuron: TensorE FLOP/s over peak bf16 FLOP/s
    mbu: float | None  # neuron: kernels' HBM bytes/s over peak HBM bytes/s
    readiness: Readiness | None  # neuron profiles only
    # what ended a run early (capture/ending.py: exception, message, op, file, line), or None
    run_ended: dict[str, Any] | None = None
    ranks_table: Ranks | None = None  # several ranks: each side by side, never summed
    job_ending: JobEnding | None = None  # a job's ranks that failed or wrote nothing (job.py)
    # what was analysed when it is an excerpt of a profile too big to analyse whole
    # (model/excerpt.py: steps, ranks, events, of_events, why); None: the whole profile
    scope: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


def _plain(x: Any) -> Any:
    if isinstance(x, pa.Table):
        return x.to_pylist()
    if hasattr(x, "__dataclass_fields__"):
        return {f.name: _plain(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def summarize(profile: Profile) -> Summary:
    """Devices, steps, the step-time breakdown, top ops and kernels, engine utilization, MFU and
    MBU, and (for neuron profiles) the readiness block."""
    ctx = context(profile)
    with ctx.lock:
        return _summarize(profile, ctx)


def _summarize(profile: Profile, ctx: AnalysisContext) -> Summary:
    cols = ctx.cols
    wall = int(cols.end().max() - cols.ints("start_ns").min()) if cols.n else 0
    steps = ctx.breakdown
    neuron = _is_neuron(ctx)
    by_self, by_total = _top_ops(ctx)
    return Summary(
        profile=str(profile.path),
        source=profile.manifest.source,
        ranks=tuple(profile.manifest.ranks),
        n_events=cols.n,
        wall_ns=wall,
        devices=_devices(ctx),
        step_stats=_step_stats(steps, ctx) if ctx.has_steps else None,
        breakdown=_breakdown(steps),
        steps=steps,
        top_ops_self=by_self,
        top_ops_total=by_total,
        top_kernels=_top_kernels(ctx),
        engines=engines(ctx),
        mfu=mfu(ctx) if neuron else None,
        mbu=mbu(ctx) if neuron else None,
        readiness=readiness(ctx) if neuron else None,
        run_ended=profile.manifest.extra.get("run_ended"),
        ranks_table=rank_table(ctx, steps),
        job_ending=job_ending(profile.manifest),
        scope=scope_of(profile),
    )


def _is_neuron(ctx: AnalysisContext) -> bool:
    return bool(ctx.manifest.device_spec) or bool(ctx.cols.like("device", ("neuron%",)).any())


def _device_rows(ctx: AnalysisContext, kinds: tuple[str, ...]) -> np.ndarray:
    cols = ctx.cols
    return cols.where("layer", ("device",)) & cols.where("kind", kinds)


def _devices(ctx: AnalysisContext) -> tuple[DeviceStats, ...]:
    """Per rank and device (a NULL device is left out): counts by kind, and the unions of its
    work and of its kernels."""
    cols = ctx.cols
    rank = cols.ints("rank")
    dev, dev_names = cols.codes("device")
    lane_all = (rank - int(rank.min() if cols.n else 0)) * (len(dev_names) + 1) + dev + 1
    work = _device_rows(ctx, DEVICE_WORK_KINDS) & (dev >= 0)
    lanes, first_of, lane_of = dense(lane_all[work])
    if not len(lanes):
        return ()
    kind_rows = {
        key: np.bincount(lane_of[cols.where("kind", kinds)[work]], minlength=len(lanes))
        for key, kinds in (("kernels", KERNEL_KINDS), ("collectives", ("collective",)),
                           ("transfers", TRANSFER_KINDS))
    }  # fmt: skip
    s, e = cols.ints("start_ns"), cols.end()
    lane_number = np.zeros(int(lanes[-1]) + 1, dtype=np.int64)
    lane_number[lanes] = np.arange(len(lanes))

    def union(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per lane: covered time, first start, last end."""
        lane = lane_number[lane_all[mask]]
        rows, ms, me = intervals.merge_arrays(lane, s[mask], e[mask])
        at = lane[rows]
        lo = np.full(len(lanes), np.iinfo(np.int64).max)
        hi = np.full(len(lanes), np.iinfo(np.int64).min)
        np.minimum.at(lo, at, ms)
        np.maximum.at(hi, at, me)
        return group_sum(at, me - ms, len(lanes)), lo, hi

    busy, lo, hi = union(work)
    comp, _, _ = union(_device_rows(ctx, COMPUTE_KINDS) & (dev >= 0))
    comm, _, _ = union(_device_rows(ctx, COMMUNICATION_KINDS) & (dev >= 0))
    first = np.flatnonzero(work)[first_of]
    out = [
        DeviceStats(
            rank=int(rank[first[i]]),
            device=str(dev_names[dev[first[i]]]),
            kernels=int(kind_rows["kernels"][i]),
            collectives=int(kind_rows["collectives"][i]),
            transfers=int(kind_rows["transfers"][i]),
            busy_ns=int(busy[i]),
            compute_ns=int(comp[i]),
            window_ns=int(hi[i] - lo[i]),
            idle_ns=int(hi[i] - lo[i] - busy[i]),
            communication_ns=int(comm[i]),
        )
        for i in range(len(lanes))
    ]
    return tuple(sorted(out, key=lambda d: (d.rank, d.device)))


def _step_stats(steps: pa.Table, ctx: AnalysisContext) -> StepStats | None:
    rows = steps.select(["step", "rank", "start_ns", "dur_ns"]).to_pylist()
    job = len(ctx.manifest.ranks) > 1 or int(ctx.manifest.extra.get("world_size") or 0) > 1
    return step_stats((StepTime(**r) for r in rows), job)


def _breakdown(steps: pa.Table) -> Breakdown:
    def total(col: str) -> int | None:
        v = pc.sum(steps[col]).as_py()
        return None if v is None else int(v)

    device_cols = ("device_compute_ns", "dma_ns", "device_idle_ns")
    vals = {c: total(c) for c in BREAKDOWN_COLUMNS}
    for c in BREAKDOWN_COLUMNS:
        if c not in device_cols and vals[c] is None:
            vals[c] = 0
    device = vals["device_compute_ns"] is not None
    labels = {c: PART_LABELS[c][0] if device else PART_LABELS[c][1] for c in PARTITION_COLUMNS}
    parts = tuple(Part(c, label, total(c) or 0) for c, label in labels.items() if label)
    overlap = tuple(
        Part(c, OVERLAP_LABELS[c], total(c) or 0) for c in OVERLAP_COLUMNS if device and total(c)
    )
    return Breakdown(
        steps_ns=int(pc.sum(steps["dur_ns"]).as_py() or 0),
        parts=parts,
        overlap=overlap,
        communication_ns=total("communication_ns"),
        **vals,  # type: ignore[arg-type]
    )


def _top_ops(ctx: AnalysisContext) -> tuple[pa.Table, pa.Table]:
    """Host ops by self time and by total time: the operator page's table, cut (so the two
    agree by construction); self = dur minus the direct children's."""
    table = operator_table(ctx.cols)
    return top_host_ops(table, "self_ns", TOP_N), top_host_ops(table, "total_ns", TOP_N)


def _top_kernels(ctx: AnalysisContext) -> pa.Table:
    """Device kernels and collectives by total time; `type` is HTA's kernel type
    (computation | communication), share is over all of them."""
    cols = ctx.cols
    rows = np.flatnonzero(_device_rows(ctx, (*COMPUTE_KINDS, *COMMUNICATION_KINDS)))
    is_comm = cols.where("kind", COMMUNICATION_KINDS)
    name, names = cols.codes("name")
    dev, dev_names = cols.codes("device")
    group, first, inverse = np.unique(name[rows], return_index=True, return_inverse=True)
    dur = cols.ints("dur_ns")[rows]
    calls = np.bincount(inverse, minlength=len(group)).astype(np.int64)
    total = group_sum(inverse, dur, len(group))
    grand = exact_sum(total)
    table = pa.table(
        {
            "name": pa.array([names[g] for g in group], pa.string()),
            "device": pa.array(
                [dev_names[d] if d >= 0 else None for d in dev[rows[first]]], pa.string()
            ),
            "type": pa.array(
                ["communication" if c else "computation" for c in is_comm[rows[first]]],
                pa.string(),
            ),
            "calls": pa.array(calls),
            "total_ns": pa.array(total),
            "mean_ns": pa.array([int(t) / int(c) for t, c in zip(total, calls, strict=True)],
                                pa.float64()),
            "share": pa.array([int(t) / grand if grand else None for t in total], pa.float64()),
        }
    )  # fmt: skip
    return table.sort_by([("total_ns", "descending"), ("name", "ascending")]).slice(0, TOP_N)

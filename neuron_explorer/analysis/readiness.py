"""The readiness block of a neuron profile's summary: what fell back to the CPU, what was
downcast from float64, what recompiled, which host syncs run in the step, what compiling
costs against the steady step, and the device memory's peak against the chip's HBM."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from .columns import exact_sum
from .context import AnalysisContext
from .conventions import (
    COMPILE_GROUP_SQL,
    DOWNCAST_EVENT,
    DOWNCAST_PREDICATE,
    NEURON_SYNC_KIND,
    PROGRAM_SQL,
)


@dataclass(frozen=True)
class Readiness:
    """For moving a model to Trainium: what fell back, what was downcast, what compiling costs."""

    fallback_ops: pa.Table  # op, file, line, func, calls, dur_ns
    downcasts: pa.Table  # op, file, line, calls
    recompiles: pa.Table  # op, recompiles, dur_ns, shapes
    syncs: pa.Table  # what, file, line, calls, steps, wait_ns: host syncs (.item(), .cpu()...)
    compile_ns: int
    first_step_ns: int | None
    steady_step_ns: float | None  # median of the steps after the first
    device_memory: DeviceMemory | None = None
    # the capture's modeling: shapes-only mode's assumptions and placeholders, and a modeled
    # job's executed ranks and copies (the manifest's extra blocks; None where not used)
    shapes_only: dict | None = None
    model_ranks: dict | None = None


@dataclass(frozen=True)
class DeviceMemory:
    """The highest device memory a rank allocated, what held it, and the chip's HBM.

    `held_bytes` splits the peak into parameters, gradients, optimizer state and the rest
    (activations and temporaries) where the capture knew them (its manifest's
    `device_memory`); a profile without that block has only the counter's peak. A rank is
    given one chip's HBM, as the collectives model gives it one chip."""

    peak_bytes: int
    rank: int | None  # the rank whose counter peaked; None when from the manifest alone
    capacity_bytes: int | None  # HBM of one chip (the spec's hbm_bytes)
    capacity_source: str | None  # where that figure comes from (the spec's source)
    chip: str | None
    held_bytes: tuple[tuple[str, int], ...] = ()

    @property
    def fits(self) -> bool | None:
        return None if not self.capacity_bytes else self.peak_bytes <= self.capacity_bytes


def device_memory(ctx: AnalysisContext) -> DeviceMemory | None:
    """The peak of device memory against the chip's HBM (None where nothing was allocated)."""
    spec = ctx.spec
    block = ctx.manifest.extra.get("device_memory") or {}
    peak = int(block.get("peak_bytes") or 0)
    rank = None
    row = ctx.one(
        """SELECT rank, max(value) AS peak FROM counters WHERE CAST(name AS VARCHAR) =
           'memory_allocated' AND CAST(track AS VARCHAR) <> 'cpu' GROUP BY rank
           ORDER BY peak DESC LIMIT 1"""
    )
    if row.get("peak") is not None and int(row["peak"]) > peak:
        peak, rank = int(row["peak"]), int(row["rank"])
    if peak <= 0:
        return None
    held = tuple((str(k), int(v)) for k, v in (block.get("held_bytes") or {}).items())
    return DeviceMemory(peak, rank, spec.hbm_bytes, spec.hbm_source, spec.name,
                        held if rank is None else ())  # fmt: skip


def readiness(ctx: AnalysisContext) -> Readiness:
    """The readiness block (neuron profiles)."""
    cols = ctx.cols
    host = cols.where("layer", ("host",))
    fallbacks = ctx.subset("ev_fallbacks", host & cols.where("kind", ("fallback",)))
    fallback = ctx.arrow(
        f"""SELECT coalesce(op_name, name) AS op, src_file AS file, src_line AS line,
               any_value(src_func) AS func, count(*) AS calls, sum(dur_ns) AS dur_ns
        FROM {fallbacks} GROUP BY 1, 2, 3 ORDER BY dur_ns DESC, op"""
    )
    # DOWNCAST_PREDICATE reads dtypes, which the context keeps on kernels only
    maybe = pc.is_valid(ctx.events["dtypes"]).to_numpy(zero_copy_only=False)
    marked = cols.where("kind", ("runtime",)) & cols.where("name", (DOWNCAST_EVENT,))
    candidates = ctx.subset("ev_downcasts", marked | (ctx.device_rows(("kernel",)) & maybe))
    downcasts = ctx.arrow(
        f"""SELECT coalesce(op_name, name) AS op, src_file AS file, src_line AS line,
               count(*) AS calls
        FROM {candidates} WHERE {DOWNCAST_PREDICATE}
        GROUP BY 1, 2, 3 ORDER BY calls DESC, op"""
    )
    # host syncs in the step, a fallback's own wait aside (that belongs to the fallback)
    syncs_ev = ctx.subset("ev_syncs", host & cols.where("kind", (NEURON_SYNC_KIND,)))
    syncs = ctx.arrow(
        f"""SELECT coalesce(json_extract_string(args, '$.reason'), name) AS what,
               src_file AS file, src_line AS line, count(*) AS calls,
               count(DISTINCT step) AS steps, sum(dur_ns) AS wait_ns
        FROM {syncs_ev} WHERE NOT (name = 'sync' AND op_name IN
                                   (SELECT op_name FROM {fallbacks}))
        GROUP BY 1, 2, 3 ORDER BY calls DESC, wait_ns DESC, what"""
    )
    ctx.ensure_recompiles()
    recompiles = ctx.arrow(
        f"""SELECT {COMPILE_GROUP_SQL} AS op,
               count(DISTINCT {PROGRAM_SQL}) AS recompiles,
               sum(dur_ns) AS dur_ns,
               list(DISTINCT coalesce(json_extract_string(args, '$.shapes'), shapes))
                   FILTER (WHERE coalesce(json_extract_string(args, '$.shapes'), shapes)
                           IS NOT NULL) AS shapes
        FROM recompiles GROUP BY 1 ORDER BY dur_ns DESC, op"""
    )
    compile_ns = exact_sum(cols.ints("dur_ns")[host & cols.where("kind", ("compile",))])
    first = steady = None
    if ctx.has_steps:
        row = ctx.one(
            """WITH r AS (SELECT e - s AS d, row_number() OVER (PARTITION BY rank ORDER BY s) AS i
                          FROM steps_w)
            SELECT max(d) FILTER (WHERE i = 1) AS first, median(d) FILTER (WHERE i > 1) AS steady
            FROM r"""
        )
        first = None if row.get("first") is None else int(row["first"])
        steady = None if row.get("steady") is None else float(row["steady"])
    extra = ctx.manifest.extra
    return Readiness(fallback, downcasts, recompiles, syncs, int(compile_ns), first, steady,
                     device_memory(ctx), extra.get("shapes_only"), extra.get("model_ranks"))  # fmt: skip

"""The readiness block of a neuron profile's summary: what fell back to the CPU, what was
downcast from float64, what recompiled, which host syncs run in the step, and what compiling
costs against the steady step."""

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
    return Readiness(fallback, downcasts, recompiles, syncs, int(compile_ns), first, steady)

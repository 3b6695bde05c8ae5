"""device-idle-gaps: the device sits idle inside steps."""

from __future__ import annotations

import pyarrow as pa

from .. import intervals
from ..context import AnalysisContext
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, fmt_pct, hotspots, register
from .launch_bound import LaunchBound


@register
class DeviceIdleGaps(Rule):
    """Long stretches inside steps where the device runs nothing.

    Pattern: the accelerator waits for the host: gaps in the device timeline while the step is
    still running (host work, syncs, data loading or launch overhead between kernels).
    Algorithm: merge the rank's device work (kernels, copies, DMA, collectives) into disjoint
    busy intervals; inside each step window the gaps are the complement; without steps, inside the rank's device window (its first to last
    device work), so the start-up before the first kernel (process start, CUDA context, the
    first copies) is never a gap. Gaps of at least MIN_GAP_NS count, less the time the host spends in
    them compiling, falling back, syncing or loading data, and less the gaps of launch-bound
    steps (the rules for those causes report that time); report when the rest adds up to at
    least MIN_IDLE_SHARE of step time. Evidence: the host ops and source lines that overlap the
    TOP_GAPS longest gaps most.
    """

    id = "device-idle-gaps"
    title = "Device idle inside steps"
    severity = "medium"
    MIN_GAP_NS = 50_000  # a gap shorter than this is launch latency, not a stall
    MIN_IDLE_SHARE = 0.10  # of step time, summed over the counted gaps
    TOP_GAPS = 20  # the gaps whose overlapping host work is reported
    fix = (
        "Look at what the host does in the longest gaps (evidence): remove device syncs there "
        "(.item(), .cpu(), print), load data in DataLoader workers with pin_memory=True, and "
        "batch many small ops with torch.compile (CUDA graphs on GPU)."
    )

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        if not ctx.device_ranks:
            return []
        ctx.ensure_busy()
        ctx.steps()
        if ctx.has_steps:
            windows = ctx.arrow("SELECT rank, s AS ws, e AS we FROM steps_w")
        else:  # start-up before the first device work (and the tail after the last) is no gap
            windows = ctx.arrow("SELECT rank, min(s) AS ws, max(e) AS we FROM busy GROUP BY rank")
        busy = ctx.arrow("SELECT * FROM busy")
        ctx.con.register("idle_gaps", intervals.gaps(busy, ["rank"], windows, self.MIN_GAP_NS))
        agg = ctx.one(
            "SELECT count(*) AS n, sum(dur_ns) AS total, max(dur_ns) AS longest FROM idle_gaps"
        )
        # idle while the host compiles, falls back, syncs or loads data is reported by those
        # rules, and gaps in launch-bound steps by launch-bound
        ctx.explained_idle  # noqa: B018 - builds `explained`
        bound, _ = LaunchBound().bound_steps(ctx)
        if bound is None:
            bound = pa.table(
                {"rank": pa.array([], pa.int32()), "start_ns": pa.array([], pa.int64())}
            )
        ctx.con.register("launch_bound_steps", bound.select(["rank", "start_ns"]))
        other = ctx.one(
            """SELECT coalesce(sum(least(x.e, g.start_ns + g.dur_ns) - greatest(x.s, g.start_ns)),
                               0) AS ns
            FROM idle_gaps g JOIN explained x ON x.rank = g.rank
                 AND x.s < g.start_ns + g.dur_ns AND x.e > g.start_ns
            WHERE NOT EXISTS (SELECT 1 FROM launch_bound_steps l
                              WHERE l.rank = g.rank AND l.start_ns = g.ws)"""
        )
        in_bound = ctx.one(
            """SELECT coalesce(sum(g.dur_ns), 0) AS ns FROM idle_gaps g
            JOIN launch_bound_steps l ON l.rank = g.rank AND g.ws = l.start_ns"""
        )
        total = max(
            int(agg.get("total") or 0) - int(other.get("ns") or 0) - int(in_bound.get("ns") or 0),
            0,
        )
        step_ns = ctx.total_step_ns
        if step_ns <= 0 or total < self.MIN_IDLE_SHARE * step_ns:
            return []
        top = f"""(SELECT * FROM idle_gaps g WHERE NOT EXISTS (SELECT 1 FROM launch_bound_steps l
                                                           WHERE l.rank = g.rank
                                                           AND l.start_ns = g.ws)
                 ORDER BY dur_ns DESC LIMIT {int(self.TOP_GAPS)})"""
        ctx.run(
            f"""CREATE OR REPLACE TEMP TABLE gap_host AS
            SELECT x.id, x.name, x.src_file, x.src_line, x.src_func,
                   least(x.start_ns + x.dur_ns, g.start_ns + g.dur_ns)
                   - greatest(x.start_ns, g.start_ns) AS ov
            FROM {top} g JOIN ev x ON x.rank = g.rank AND x.layer = 'host'
                 AND x.kind IN ('op', 'runtime', 'sync', 'fallback', 'compile', 'copy')
                 AND x.start_ns < g.start_ns + g.dur_ns AND x.start_ns + x.dur_ns > g.start_ns"""
        )
        ops = hotspots(
            ctx.rows(
                """SELECT name AS label, sum(ov) AS dur_ns, count(*) AS count FROM gap_host
                GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5"""
            )
        )
        lines = hotspots(
            ctx.rows(
                """SELECT src_file || ':' || src_line AS label, src_file AS file,
                       src_line AS line, any_value(src_func) AS func,
                       sum(ov) AS dur_ns, count(*) AS count FROM gap_host
                WHERE src_file IS NOT NULL GROUP BY src_file, src_line
                ORDER BY dur_ns DESC, label LIMIT 5"""
            )
        )
        ids = tuple(
            int(r[0])
            for r in ctx.con.execute(
                "SELECT id FROM gap_host ORDER BY ov DESC, id LIMIT 20"
            ).fetchall()
        )
        share = total / step_ns
        n = int(agg["n"])
        startup = int(
            ctx.one(
                """SELECT coalesce(sum(b.s - w.s), 0) AS ns FROM steps_w w JOIN
                   (SELECT rank, min(s) AS s FROM busy GROUP BY rank) b USING (rank)"""
            ).get("ns")
            or 0
        )
        return [
            self.finding(
                ctx,
                title=f"Device idle {fmt_pct(share)} of step time in {n} gaps of "
                f">= {self.MIN_GAP_NS / 1000:.0f} us",
                detail=(
                    f"The device ran nothing for {fmt_ms(total)} "
                    f"{'inside the profiled steps' if ctx.has_steps else 'while it was in use'} "
                    f"({n} gaps, the longest {fmt_ms(agg['longest'])}). During those gaps the "
                    "host was busy with the ops listed; the device waits for them."
                    + (
                        ""
                        if ctx.has_steps
                        else " The profile has no steps: only the gaps between the first and "
                        f"the last device work count, not the {fmt_ms(startup)} before it "
                        "(start-up); record steps with prof.step() to see one step's gaps."
                    )
                ),
                saving_ns=total,
                evidence=Evidence(
                    event_ids=ids,
                    ops=ops,
                    source_lines=lines,
                    metrics={
                        "idle_share": round(share, 4),
                        "gaps": n,
                        "idle_ns": total,
                        "longest_gap_ns": int(agg["longest"]),
                        "startup_ns": 0 if ctx.has_steps else startup,
                    },
                ),
            )
        ]

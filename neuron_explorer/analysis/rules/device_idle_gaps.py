"""device-idle-gaps: the device sits idle inside steps."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import intervals
from ..context import AnalysisContext
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct, hotspots, ids_of

NOT_BOUND = """NOT EXISTS (SELECT 1 FROM launch_bound_steps l
                      WHERE l.rank = g.rank AND l.start_ns = g.ws)"""
# idle while the host compiles, falls back, syncs or loads data is reported by those rules,
# and gaps in launch-bound steps by launch-bound
OVERLAP = f"""SELECT coalesce(sum(least(x.e, g.start_ns + g.dur_ns) - greatest(x.s, g.start_ns)),
                             0) AS ns
FROM idle_gaps g JOIN causes x ON x.rank = g.rank
     AND x.s < g.start_ns + g.dur_ns AND x.e > g.start_ns
WHERE {NOT_BOUND}"""
IN_BOUND = """SELECT coalesce(sum(g.dur_ns), 0) AS ns FROM idle_gaps g
JOIN launch_bound_steps l ON l.rank = g.rank AND g.ws = l.start_ns"""
STARTUP = """SELECT coalesce(sum(b.s - w.s), 0) AS ns FROM steps_w w JOIN
   (SELECT rank, min(s) AS s FROM busy GROUP BY rank) b USING (rank)"""
GAP_HOST = """SELECT x.id, x.name, x.src_file, x.src_line, x.src_func,
       least(x.start_ns + x.dur_ns, g.start_ns + g.dur_ns) - greatest(x.start_ns, g.start_ns) AS ov
FROM top_gaps g JOIN ev x ON x.rank = g.rank AND x.layer = 'host'
     AND x.kind IN ('op', 'runtime', 'sync', 'fallback', 'compile', 'copy')
     AND x.start_ns < g.start_ns + g.dur_ns AND x.start_ns + x.dur_ns > g.start_ns"""


@dataclass(frozen=True)
class Gaps:
    gaps: int  # of at least MIN_GAP_NS
    gaps_ns: int
    longest_ns: int
    explained_ns: int  # of that, while the host compiles, falls back, syncs or loads data
    setup_ns: int  # more of it while the host sets the device up (start-up, not a saving)
    bound_ns: int  # in launch-bound steps
    step_ns: int
    has_steps: bool
    startup_ns: int  # before the first device work (without steps)
    table: Any  # pa.Table idle_gaps (rank, ws, start_ns, dur_ns), for the evidence
    # the reported idle time as host time (rank, start_ns, end_ns): the counted gaps outside
    # launch-bound steps, less their explained and set-up parts (the replay removes them)
    spans: tuple[tuple[int, int, int], ...] = ()

    @property
    def idle_ns(self) -> int:
        """The idle time this rule reports."""
        return max(self.gaps_ns - self.explained_ns - self.setup_ns - self.bound_ns, 0)


class DeviceIdleGaps(Rule[Gaps]):
    """Long stretches inside steps where the device runs nothing.

    Pattern: the accelerator waits for the host: gaps in the device timeline while the step is
    still running (host work, syncs, data loading or launch overhead between kernels).
    Algorithm: merge the rank's device work (kernels, copies, DMA, collectives) into disjoint
    busy intervals; inside each step window the gaps are the complement; without steps, inside
    the rank's device window (its first to last device work), so the start-up before the first
    kernel (process start, CUDA context, the first copies) is never a gap. Gaps of at least
    MIN_GAP_NS count, less the time the host spends in them compiling, falling back, syncing or
    loading data, and less the gaps of launch-bound steps (the rules for those causes report
    that time), and less the time the host spends in them setting the device up (runtime calls
    that create the context or streams, reserve memory or load modules, or a kernel
    launch of 10 ms or more, which loads its module: CUDA and cuDNN start-up, which these fixes
    do not remove; facts.SETUP_RUNTIME_LIKE); report when the rest adds up to at least
    MIN_IDLE_SHARE of step time. Evidence: the host ops and source lines that overlap the
    TOP_GAPS longest gaps most. The fix is the host's, and which one depends on what the host
    does there, so the saving is the replay of the host's time in those gaps (less the parts
    above) removed: what making all of it free would give back, an upper bound of any one fix,
    and less than the idle time where the device then becomes what the step waits for.
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

    def measure(self, ctx: AnalysisContext) -> Gaps | None:
        if not ctx.device_ranks:
            return None
        if ctx.has_steps:
            windows = ctx.arrow("SELECT rank, s AS ws, e AS we FROM steps_w")
        else:  # start-up before the first device work (and the tail after the last) is no gap
            windows = ctx.arrow("SELECT rank, min(s) AS ws, max(e) AS we FROM busy GROUP BY rank")
        busy = ctx.arrow("SELECT * FROM busy")
        gaps = intervals.gaps(busy, ["rank"], windows, self.MIN_GAP_NS)
        agg = ctx.one(
            "SELECT count(*) AS n, sum(dur_ns) AS total, max(dur_ns) AS longest FROM idle_gaps",
            tables={"idle_gaps": gaps},
        )
        explained = ctx.one(
            OVERLAP.replace("JOIN causes", "JOIN explained"), tables={"idle_gaps": gaps}
        )
        with_setup = explained
        if ctx.one("SELECT count(*) AS n FROM setup_calls")["n"]:
            causes = ctx.merge(
                "SELECT rank, s, e FROM explained UNION ALL SELECT * FROM setup_calls"
            )
            with_setup = ctx.one(OVERLAP, tables={"idle_gaps": gaps, "causes": causes})
        bound = ctx.one(IN_BOUND, tables={"idle_gaps": gaps})
        facts = Gaps(
            gaps=int(agg["n"]),
            gaps_ns=int(agg.get("total") or 0),
            longest_ns=int(agg.get("longest") or 0),
            explained_ns=int(explained.get("ns") or 0),
            setup_ns=int(with_setup.get("ns") or 0) - int(explained.get("ns") or 0),
            bound_ns=int(bound.get("ns") or 0),
            step_ns=ctx.total_step_ns,
            has_steps=ctx.has_steps,
            startup_ns=0 if ctx.has_steps else int(ctx.one(STARTUP).get("ns") or 0),
            table=gaps,
        )
        if not self.gate(facts):
            return facts
        own = ctx.rows(f"SELECT rank, start_ns, dur_ns FROM idle_gaps g WHERE {NOT_BOUND}",
                       tables={"idle_gaps": gaps})  # fmt: skip
        causes = ctx.rows("SELECT rank, s, e FROM explained UNION ALL SELECT * FROM setup_calls")
        return replace(facts, spans=_less(own, causes))

    def gate(self, facts: Gaps) -> bool:
        return facts.step_ns > 0 and facts.idle_ns >= self.MIN_IDLE_SHARE * facts.step_ns

    def evidence(self, ctx: AnalysisContext, facts: Gaps) -> Evidence:
        """The host work overlapping the TOP_GAPS longest gaps outside launch-bound steps."""
        top = ctx.arrow(
            f"""SELECT * FROM idle_gaps g WHERE {NOT_BOUND}
            ORDER BY dur_ns DESC, rank, start_ns LIMIT {int(self.TOP_GAPS)}""",
            tables={"idle_gaps": facts.table},
        )
        host = ctx.arrow(GAP_HOST, tables={"top_gaps": top})
        ops = ctx.rows(
            """SELECT name AS label, sum(ov) AS dur_ns, count(*) AS count FROM gap_host
            GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5""",
            tables={"gap_host": host},
        )
        lines = ctx.rows(
            """SELECT src_file || ':' || src_line AS label, src_file AS file,
                   src_line AS line, any_value(src_func) AS func,
                   sum(ov) AS dur_ns, count(*) AS count FROM gap_host
            WHERE src_file IS NOT NULL GROUP BY src_file, src_line
            ORDER BY dur_ns DESC, label LIMIT 5""",
            tables={"gap_host": host},
        )
        ids = ids_of(
            ctx, "SELECT id FROM gap_host ORDER BY ov DESC, id LIMIT 20", {"gap_host": host}
        )
        metrics: dict[str, float] = {
            "idle_share": round(facts.idle_ns / facts.step_ns, 4),
            "gaps": facts.gaps,
            "idle_ns": facts.idle_ns,
            "longest_gap_ns": facts.longest_ns,
            "startup_ns": facts.startup_ns,
        }
        if facts.setup_ns:
            metrics["setup_idle_ns"] = facts.setup_ns
        return Evidence(
            event_ids=ids, ops=hotspots(ops), source_lines=hotspots(lines), metrics=metrics
        )

    def explain(self, facts: Gaps, evidence: Evidence) -> Draft:
        total, n = facts.idle_ns, facts.gaps
        where = "inside the profiled steps" if facts.has_steps else "while it was in use"
        no_steps = (
            " The profile has no steps: only the gaps between the first and the last device "
            f"work count, not the {fmt_ms(facts.startup_ns)} before it (start-up); record "
            "steps with prof.step() to see one step's gaps."
        )
        setup = (
            f" Not counted: {fmt_ms(facts.setup_ns)} of idle time while the host set the device "
            "up (context, streams, memory reservations, module loading): start-up, which these "
            "fixes do not remove."
        )
        return Draft(
            title=f"Device idle {fmt_pct(total / facts.step_ns)} of step time in {n} gaps of "
            f">= {self.MIN_GAP_NS / 1000:.0f} us",
            detail=(
                f"The device ran nothing for {fmt_ms(total)} {where} ({n} gaps, the longest "
                f"{fmt_ms(facts.longest_ns)}). During those gaps the host was busy with the ops "
                "listed; the device waits for them."
                + ("" if facts.has_steps else no_steps)
                + (setup if facts.setup_ns else "")
            ),
            saving_ns=total,
            evidence=evidence,
            change=Replayed(
                f"the host's time in these {n} gaps removed (whatever it does there made free: "
                "an upper bound of any one fix)",
                "",
                "remove_spans",
                spans=facts.spans,
            ),
        )


def _less(gaps: list[dict[str, Any]], causes: list[dict[str, Any]]) -> tuple:
    """Each gap (rank, start_ns, dur_ns) less the cause intervals (rank, s, e) of its rank, as
    (rank, start_ns, end_ns) pieces."""
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for c in causes:
        by_rank.setdefault(int(c["rank"]), []).append((int(c["s"]), int(c["e"])))
    for v in by_rank.values():
        v.sort()
    out = []
    for g in gaps:
        r, a = int(g["rank"]), int(g["start_ns"])
        b = a + int(g["dur_ns"])
        for s, e in by_rank.get(r, ()):
            if e <= a or s >= b:
                continue
            if s > a:
                out.append((r, a, s))
            a = max(a, e)
            if a >= b:
                break
        if a < b:
            out.append((r, a, b))
    return tuple(sorted(out))

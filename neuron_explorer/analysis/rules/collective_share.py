"""collective-share: communication takes a large share of the step, or differs across ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .. import intervals
from ..context import AnalysisContext
from ..conventions import COMPUTE_KINDS, sql_list
from ..findings import Evidence, Hotspot
from ..rule import Draft, Rule, fmt_ms, fmt_pct, longest_ids, top_ops

DEVICE = "layer = 'device' AND kind = 'collective'"
HOST = "layer = 'host' AND kind = 'collective'"
# a rank's device collectives when it has any, else its host collective spans
WHERE = f"""(({DEVICE}) OR (({HOST}) AND rank NOT IN
             (SELECT DISTINCT rank FROM ev WHERE {DEVICE})))"""
# collective time counts inside the step windows only (async ones can outlive steps)
SPANS = f"""SELECT x.rank, greatest(x.start_ns, w.s) AS s, least(x.start_ns + x.dur_ns, w.e) AS e
FROM (SELECT * FROM ev WHERE {WHERE}) x JOIN steps_w w ON w.rank = x.rank
     AND x.start_ns < w.e AND x.start_ns + x.dur_ns > w.s"""
# The spread compares what each rank's steps launched, whenever its device ran it (by the time
# windows where an event has no step): a rank whose host runs ahead of its device (FSDP2's never
# blocks on its collectives) would otherwise count fewer of its collectives inside its host
# windows than a symmetric peer, and look uneven.
LAUNCHED = f"""SELECT x.rank, x.start_ns AS s, x.start_ns + x.dur_ns AS e
FROM (SELECT * FROM ev WHERE {WHERE}) x JOIN steps_w w ON w.rank = x.rank
     AND (x.step = w.step OR ((x.step IS NULL OR w.step IS NULL)
                              AND x.start_ns < w.e AND x.start_ns + x.dur_ns > w.s))"""
OTHER_COMPUTE = (
    f"SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM ev WHERE layer = 'device' "
    f"AND kind IN {sql_list(COMPUTE_KINDS)} AND kind <> 'collective' "
    f"AND rank IN (SELECT DISTINCT rank FROM ev WHERE {DEVICE})"
)
# Per rank: collective time, the part of it other compute overlaps, and the step time. The
# collective spans carry overlap_ns, the time the disjoint other-compute intervals cover inside
# each (a sort and binary search: the range join it replaces took 30 s on 13k collectives
# against 0.9M kernels).
PER_RANK = """
WITH tot AS (SELECT rank, sum(e - s) AS coll, sum(overlap_ns) AS overlap FROM coll_spans
             GROUP BY rank),
     st AS (SELECT rank, sum(e - s) AS step_ns FROM steps_w GROUP BY rank)
SELECT st.rank, coalesce(tot.coll, 0) AS coll, coalesce(tot.overlap, 0) AS overlap,
       st.step_ns FROM st LEFT JOIN tot USING (rank)
ORDER BY st.rank"""
# The same overlap by a range join, for spans too far apart to lay on one int64 axis.
OVERLAP_JOIN = """
WITH ov AS (SELECT c.rank, c.s, sum(least(c.e, o.e) - greatest(c.s, o.s)) AS ns
            FROM coll c JOIN other_compute o ON o.rank = c.rank AND o.s < c.e AND o.e > c.s
            GROUP BY c.rank, c.s)
SELECT c.rank, c.s, c.e, coalesce(ov.ns, 0) AS overlap_ns FROM coll c LEFT JOIN ov USING (rank, s)
ORDER BY c.rank, c.s"""

BOUND = (
    "all the exposed communication hidden under compute; not replayed: how much of it a "
    "bucketing or no_sync change hides depends on the order of the backward's work, which "
    "the profile does not fix"
)


def overlapped(ctx: AnalysisContext) -> pa.Table:
    """The rank's collective spans in its steps, merged (rank, s, e), each with overlap_ns: the
    time other device compute of the rank runs inside it."""
    coll, other = ctx.merge(SPANS), ctx.merge(OTHER_COMPUTE)
    windows = coll.rename_columns(["rank", "ws", "we"])
    try:
        overlap = intervals.covered(other, ["rank"], windows)
    except OverflowError:  # spans too wide for one int64 axis: let DuckDB join them
        return ctx.arrow(OVERLAP_JOIN, tables={"coll": coll, "other_compute": other})
    return coll.append_column("overlap_ns", pa.array(overlap, pa.int64()))


@dataclass(frozen=True)
class Communication:
    rows: tuple[dict[str, Any], ...]  # per rank: rank, coll, overlap, step_ns
    launched: dict[int, int]  # rank -> time of the collectives its steps launched

    @property
    def exposed(self) -> dict[int, int]:
        return {r["rank"]: int(r["coll"] - r["overlap"]) for r in self.rows}

    @property
    def shares(self) -> dict[int, float]:
        exposed = self.exposed
        return {r["rank"]: exposed[r["rank"]] / r["step_ns"] for r in self.rows if r["step_ns"]}

    @property
    def colls(self) -> list[int]:
        return [int(r["coll"]) for r in self.rows]

    @property
    def spread(self) -> float:
        """The busiest rank's collective time over the least busy one's, each over the
        collectives its steps launched."""
        colls = [self.launched.get(int(r["rank"]), 0) for r in self.rows]
        many = len(self.rows) > 1
        if many and min(colls) > 0:
            return max(colls) / min(colls)
        return float("inf") if many else 1.0

    @property
    def worst(self) -> int | None:
        shares = self.shares
        return max(shares, key=lambda k: shares[k]) if shares else None


class CollectiveShare(Rule[Communication]):
    """Collective communication that is exposed (not overlapped) or uneven across ranks.

    Pattern: all-reduce, all-gather or broadcast time adds to every step when it does not
    overlap compute (small DDP buckets, gradients synchronised every micro-batch, gloo on CPU);
    a rank that spends much more time in collectives than another waits for a straggler.
    Algorithm: per rank, the collective intervals are the device collectives (kind collective on
    the device layer) when the rank has any, else its host spans of kind collective (nccl:*,
    gloo:* record_functions), clipped to the step windows. Exposed time = collective time not overlapped by other device
    compute on the rank. Report when a rank's exposed time is at least MIN_SHARE of its step
    time, or when with several ranks the largest collective time (over the collectives each
    rank's steps launched, whenever its device ran them: a host that runs ahead of its device,
    as FSDP2's does, keeps fewer of them inside its step windows) is at least SPREAD_RATIO
    times the smallest. The saving is the exposed time (an upper bound: full overlap).
    """

    id = "collective-share"
    title = "Collective communication share and spread"
    severity = "medium"
    MIN_SHARE = 0.10
    SPREAD_RATIO = 1.5
    fix = (
        "Overlap communication with compute: let DDP overlap bucketed all-reduces with backward "
        "(tune bucket_cap_mb), skip the sync on accumulation micro-batches with model.no_sync(), "
        "and for uneven ranks balance the data per rank or find the straggler's extra work."
    )

    def measure(self, ctx: AnalysisContext) -> Communication | None:
        if not ctx.one("SELECT count(*) AS n FROM ev WHERE kind = 'collective'").get("n"):
            return None
        rows = ctx.rows(PER_RANK, tables={"coll_spans": overlapped(ctx)})
        rows = [r for r in rows if r["coll"] > 0 or len(rows) > 1]
        if not any(r["coll"] > 0 for r in rows):
            return None
        return Communication(tuple(rows), intervals.length_by_rank(ctx.merge(LAUNCHED)))

    def uneven(self, facts: Communication) -> bool:
        return len(facts.rows) > 1 and facts.spread >= self.SPREAD_RATIO

    def gate(self, facts: Communication) -> bool:
        worst = facts.worst
        high = worst is not None and facts.shares[worst] >= self.MIN_SHARE
        return high or self.uneven(facts)

    def evidence(self, ctx: AnalysisContext, facts: Communication) -> Evidence:
        exposed, shares, spread = facts.exposed, facts.shares, facts.spread
        per_rank = tuple(
            Hotspot(
                label=f"rank {r['rank']}",
                dur_ns=int(r["coll"]),
                count=1,
                note=f"exposed {fmt_ms(exposed[r['rank']])}",
            )
            for r in facts.rows
        )
        return Evidence(
            event_ids=longest_ids(ctx, WHERE),
            ops=top_ops(ctx, WHERE) + per_rank,
            metrics={
                "collective_ns": sum(facts.colls),
                "exposed_ns": sum(exposed.values()),
                "max_exposed_share": round(max(shares.values(), default=0.0), 4),
                "ranks": len(facts.rows),
                "spread": round(spread, 3) if spread != float("inf") else -1.0,
            },
        )

    def explain(self, facts: Communication, evidence: Evidence) -> Draft:
        n, spread, worst = len(facts.rows), facts.spread, facts.worst
        total_exposed = sum(facts.exposed.values())
        spread_txt = f"; spread across {n} ranks {spread:.2f}x" if n > 1 else ""
        share = facts.shares[worst] if worst is not None else 0.0
        return Draft(
            title=f"Collectives: {fmt_pct(share)} of step time exposed on rank {worst}{spread_txt}",
            detail=(
                f"Collective communication takes {fmt_ms(sum(facts.colls))} over {n} "
                f"rank(s), {fmt_ms(total_exposed)} of it not overlapped by compute."
                + (
                    f" The busiest rank spends {spread:.2f}x the time of the least busy one "
                    "in collectives, which usually means the others wait for a straggler."
                    if self.uneven(facts)
                    else ""
                )
            ),
            saving_ns=total_exposed,
            bound=BOUND,
            evidence=evidence,
        )

"""collective-share: communication takes a large share of the step, or differs across ranks."""

from __future__ import annotations

from ..context import AnalysisContext
from ..conventions import COMPUTE_KINDS, sql_list
from ..findings import Evidence, Finding, Hotspot
from ..rule import Rule, fmt_ms, fmt_pct, longest_ids, register, top_ops


@register
class CollectiveShare(Rule):
    """Collective communication that is exposed (not overlapped) or uneven across ranks.

    Pattern: all-reduce, all-gather or broadcast time adds to every step when it does not
    overlap compute (small DDP buckets, gradients synchronised every micro-batch, gloo on CPU);
    a rank that spends much more time in collectives than another waits for a straggler.
    Algorithm: per rank, the collective intervals are the device collectives (kind collective on
    the device layer) when the rank has any, else its host spans of kind collective (nccl:*,
    gloo:* record_functions), clipped to the step windows. Exposed time = collective time not overlapped by other device
    compute on the rank. Report when a rank's exposed time is at least MIN_SHARE of its step
    time, or when with several ranks the largest collective time is at least SPREAD_RATIO times
    the smallest. The saving is the exposed time (an upper bound: full overlap).
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

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        if not ctx.one("SELECT count(*) AS n FROM ev WHERE kind = 'collective'").get("n"):
            return []
        dev = "layer = 'device' AND kind = 'collective'"
        host = "layer = 'host' AND kind = 'collective'"
        where = f"""(({dev}) OR (({host}) AND rank NOT IN
                     (SELECT DISTINCT rank FROM ev WHERE {dev})))"""
        # collective time counts inside the step windows only (async ones can outlive steps)
        src = f"""SELECT x.rank, greatest(x.start_ns, w.s) AS s,
                      least(x.start_ns + x.dur_ns, w.e) AS e
               FROM (SELECT * FROM ev WHERE {where}) x JOIN steps_w w ON w.rank = x.rank
                    AND x.start_ns < w.e AND x.start_ns + x.dur_ns > w.s"""
        other = (
            f"SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM ev WHERE layer = 'device' "
            f"AND kind IN {sql_list(COMPUTE_KINDS)} AND kind <> 'collective' "
            f"AND rank IN (SELECT DISTINCT rank FROM ev WHERE {dev})"
        )
        ctx.steps()
        ctx.merged("coll_spans", src)
        ctx.merged("other_compute", other)
        rows = ctx.rows(
            """WITH c AS (SELECT * FROM coll_spans), o AS (SELECT * FROM other_compute),
                 tot AS (SELECT rank, sum(e - s) AS coll FROM c GROUP BY rank),
                 ov AS (SELECT c.rank, sum(least(c.e, o.e) - greatest(c.s, o.s)) AS overlap
                        FROM c JOIN o ON o.rank = c.rank AND o.s < c.e AND o.e > c.s
                        GROUP BY c.rank),
                 st AS (SELECT rank, sum(e - s) AS step_ns FROM steps_w GROUP BY rank)
            SELECT st.rank, coalesce(tot.coll, 0) AS coll, coalesce(ov.overlap, 0) AS overlap,
                   st.step_ns FROM st LEFT JOIN tot USING (rank) LEFT JOIN ov USING (rank)
            ORDER BY st.rank"""
        )
        rows = [r for r in rows if r["coll"] > 0 or len(rows) > 1]
        if not any(r["coll"] > 0 for r in rows):
            return []
        exposed = {r["rank"]: int(r["coll"] - r["overlap"]) for r in rows}
        shares = {r["rank"]: exposed[r["rank"]] / r["step_ns"] for r in rows if r["step_ns"]}
        colls = [int(r["coll"]) for r in rows]
        spread = (
            (max(colls) / min(colls))
            if len(rows) > 1 and min(colls) > 0
            else (float("inf") if len(rows) > 1 else 1.0)
        )
        worst = max(shares, key=lambda k: shares[k]) if shares else None
        high = worst is not None and shares[worst] >= self.MIN_SHARE
        uneven = len(rows) > 1 and spread >= self.SPREAD_RATIO
        if not (high or uneven):
            return []
        total_exposed = sum(exposed.values())
        per_rank = tuple(
            Hotspot(
                label=f"rank {r['rank']}",
                dur_ns=int(r["coll"]),
                count=1,
                note=f"exposed {fmt_ms(exposed[r['rank']])}",
            )
            for r in rows
        )
        spread_txt = f"; spread across {len(rows)} ranks {spread:.2f}x" if len(rows) > 1 else ""
        return [
            self.finding(
                ctx,
                title=f"Collectives: {fmt_pct(shares.get(worst, 0.0))} of step time exposed "
                f"on rank {worst}{spread_txt}",
                detail=(
                    f"Collective communication takes {fmt_ms(sum(colls))} over {len(rows)} "
                    f"rank(s), {fmt_ms(total_exposed)} of it not overlapped by compute."
                    + (
                        f" The busiest rank spends {spread:.2f}x the time of the least busy one "
                        "in collectives, which usually means the others wait for a straggler."
                        if uneven
                        else ""
                    )
                ),
                saving_ns=total_exposed,
                evidence=Evidence(
                    event_ids=longest_ids(ctx, where),
                    ops=top_ops(ctx, where) + per_rank,
                    metrics={
                        "collective_ns": sum(colls),
                        "exposed_ns": total_exposed,
                        "max_exposed_share": round(max(shares.values(), default=0.0), 4),
                        "ranks": len(rows),
                        "spread": round(spread, 3) if spread != float("inf") else -1.0,
                    },
                ),
            )
        ]

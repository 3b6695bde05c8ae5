"""collective-outliers: single collectives far slower than the others of their kind and size."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..collectives import P2P, Collective, collectives, with_blocked
from ..context import AnalysisContext
from ..findings import Evidence, Hotspot
from ..rule import Draft, Rule, fmt_ms

BOUND = (
    "the outliers at their group's median; not replayed: a late rank's wait comes from what "
    "another rank did before the call, which this finding does not name as events"
)


@dataclass(frozen=True)
class Groups:
    """The device collectives grouped by (name, bytes), each group with its median time."""

    groups: tuple[tuple[tuple[Collective, ...], float], ...]


class CollectiveOutliers(Rule[Groups]):
    """Collectives much longer than the median of their group, split into wait and transfer.

    Pattern: most all-reduces of one size take the same time, a few take far longer: a rank
    arrived late (wait: a straggler, a host stall before the call) or the link was slow
    (transfer: contention, a collective crossing instances over EFA).
    Algorithm: group the device collectives of the steady steps (a job's first step of each
    rank holds the ranks' start-up skew and is left out) by (name, bytes) over all ranks; in a
    group of at least MIN_GROUP, a collective is an outlier when its time is more than RATIO
    times the group's median and at least MIN_EXTRA_NS above it. Its time is its transfer plus
    the part of its wait for the last rank during which its host was blocked
    (analysis/collectives.py): a wait the host never sat through (FSDP2's collectives, issued on
    side streams, while the host runs ahead) cost the rank nothing. A GPU trace's collective
    kernel counts as transfer + wait together (reported as wait). Point-to-point sends and
    receives are left out: a pipeline stage waits for its neighbour by design (pipeline-bubbles).
    The saving is the time above the median, summed.
    """

    id = "collective-outliers"
    title = "Collective outliers"
    severity = "medium"
    RATIO = 2.0
    MIN_EXTRA_NS = 200_000
    MIN_GROUP = 3
    fix = (
        "Look at what the late rank did before the slow collectives (their wait part): a data "
        "loader stall, a host sync, extra work on one rank. A slow transfer part points at the "
        "link: keep tensor-parallel groups inside one instance (NeuronLink) and fewer, larger "
        "collectives (bucket them)."
    )

    def measure(self, ctx: AnalysisContext) -> Groups:
        by_key: dict[tuple[str, int], list[Collective]] = {}
        steady = {(int(r["rank"]), r["step"]) for r in ctx.steady_steps().to_pylist()}
        left_out = {(int(r["rank"]), r["step"]) for r in ctx.steps().to_pylist()} - steady
        # a receive waits for its pipeline neighbour by design: pipeline-bubbles' subject
        for c in with_blocked(ctx, [c for c in collectives(ctx) if c.name != P2P]):
            if (c.rank, c.step) not in left_out:
                by_key.setdefault((c.name, c.bytes), []).append(c)
        return Groups(
            tuple(
                (tuple(cs), statistics.median(c.total_ns for c in cs))
                for cs in by_key.values()
                if len(cs) >= self.MIN_GROUP
            )
        )

    def outliers(self, facts: Groups) -> list[tuple[Collective, float]]:
        """The outliers with their group's median, the most extra time first."""
        out = [
            (c, med)
            for cs, med in facts.groups
            for c in cs
            if c.total_ns > self.RATIO * med and c.total_ns - med >= self.MIN_EXTRA_NS
        ]
        return sorted(out, key=lambda cm: cm[0].total_ns - cm[1], reverse=True)

    def gate(self, facts: Groups) -> bool:
        return bool(self.outliers(facts))

    def explain(self, facts: Groups, evidence: Evidence) -> Draft:
        outliers = self.outliers(facts)
        extra = sum(c.total_ns - med for c, med in outliers)
        wait = sum(c.total_ns - c.transfer_ns for c, _ in outliers)
        transfer = sum(c.transfer_ns for c, _ in outliers)
        worst = outliers[0][0]
        return Draft(
            title=f"{len(outliers)} collective(s) far slower than their group's median",
            detail=(
                f"{len(outliers)} collectives take {fmt_ms(extra)} more than the median of "
                f"collectives of the same kind and size; {fmt_ms(wait)} of their time is "
                f"waiting for the last rank and {fmt_ms(transfer)} transfer. The worst is a "
                f"{worst.name} of {worst.bytes} bytes on rank {worst.rank}"
                + (f" in step {worst.step}." if worst.step is not None else ".")
            ),
            saving_ns=extra,
            bound=BOUND,
            evidence=Evidence(
                event_ids=tuple(c.id for c, _ in outliers[:20]),
                ops=tuple(
                    Hotspot(
                        label=f"{c.name} rank {c.rank} step {c.step}",
                        dur_ns=c.total_ns,
                        count=1,
                        note=f"median {fmt_ms(med)}; wait {fmt_ms(c.total_ns - c.transfer_ns)}, "
                        f"transfer {fmt_ms(c.transfer_ns)}",
                    )
                    for c, med in outliers[:10]
                ),
                metrics={
                    "outliers": len(outliers),
                    "extra_ns": int(extra),
                    "wait_ns": int(wait),
                    "transfer_ns": int(transfer),
                },  # fmt: skip
            ),
        )

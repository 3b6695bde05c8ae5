"""What the cross-rank rules (rules/straggler.py, rules/collective_outliers.py) share: each rank's steps with the time it waited in collectives."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .context import AnalysisContext

# A neuron collective records its wait (for the last rank to arrive) and its modeled transfer in
# args; a GPU trace's collective kernel has only its duration, which holds both.
COLLECTIVES = "kind = 'collective' AND layer = 'device'"


@dataclass(frozen=True)
class RankStep:
    rank: int
    step: int
    dur_ns: int
    wait_ns: int

    @property
    def busy_ns(self) -> int:
        return max(self.dur_ns - self.wait_ns, 0)


@dataclass(frozen=True)
class Collective:
    id: int
    rank: int
    step: int | None
    name: str
    bytes: int
    wait_ns: int
    transfer_ns: int
    start_ns: int = 0
    match: str = ""  # "group/seq": the same collective on every rank of a neuron capture

    @property
    def total_ns(self) -> int:
        return self.wait_ns + self.transfer_ns


def collectives(ctx: AnalysisContext) -> list[Collective]:
    """Every device collective with its wait and transfer split (wait 0 where not recorded)."""
    rows = ctx.rows(
        f"""SELECT id, rank, step, name, coalesce(bytes_read, 0) AS bytes, start_ns, dur_ns,
        args FROM ev WHERE {COLLECTIVES} ORDER BY rank, start_ns"""
    )
    out = []
    for r in rows:
        args = json.loads(r["args"]) if r["args"] else {}
        recorded = "wait_ns" in args
        out.append(
            Collective(
                id=int(r["id"]),
                rank=int(r["rank"]),
                step=None if r["step"] is None else int(r["step"]),
                name=str(r["name"]),
                bytes=int(args.get("bytes", r["bytes"])),
                wait_ns=int(args["wait_ns"]) if recorded else int(r["dur_ns"]),
                transfer_ns=int(args.get("transfer_ns", r["dur_ns"])) if recorded else 0,
                start_ns=int(r["start_ns"]),
                match=f"{args['group']}/{args['seq']}" if {"group", "seq"} <= args.keys() else "",
            )
        )
    return out


def rank_step_waits(ctx: AnalysisContext) -> dict[int, list[RankStep]]:
    """rank -> its steps (real step windows only), each with its collective wait."""
    if not ctx.has_steps:
        return {}
    waits: dict[tuple[int, int], int] = {}
    for c in collectives(ctx):
        if c.step is not None:
            waits[(c.rank, c.step)] = waits.get((c.rank, c.step), 0) + c.wait_ns
    out: dict[int, list[RankStep]] = {}
    for row in ctx.steps().to_pylist():
        rank, step = int(row["rank"]), int(row["step"])
        out.setdefault(rank, []).append(
            RankStep(rank, step, int(row["dur_ns"]), waits.get((rank, step), 0))
        )
    return out

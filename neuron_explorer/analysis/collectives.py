"""What the cross-rank rules (rules/straggler.py, rules/collective_outliers.py) and the per-rank
table share: each collective's wait, and each rank's steps with the time it waited for the
other ranks.

A neuron collective records `wait_ns`: from when this rank's collective queue could start it to
the last rank's arrival (on a GPU, the spin-wait at the start of the NCCL kernel, which HTA
counts as communication time: HTA times a collective kernel from its launch and has no
cross-rank wait of its own). That wait costs the rank time only while its host is blocked
(in a blocking collective, `c10d::wait`, or a device sync): a program whose host never waits
for its collectives (FSDP2's side streams) runs on, its device merely starts them later. So a
rank's **wait** is the time its host was blocked while one of its collectives waited for
another rank: the intersection of the two unions of intervals, never a sum of overlapping
waits. A collective's `blocked_ns` is its own share of that. A GPU trace records no wait: there
the union of the collective kernels' spans stands in for it (an upper bound).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np

from ..vocab.intervals import merge_arrays
from .context import AnalysisContext
from .conventions import sync_predicate

# the wait as the pages state it (the Ranks page, docs/fleet.md)
WAIT_DEFINITION = (
    "Wait: the time a rank's host was blocked (in a blocking collective, c10d::wait or a device "
    "sync) while one of its collectives waited for the last rank to arrive: the overlap of the "
    "two, each a union of spans, so overlapping waits are never added up. Busy: the steps' time "
    "less that wait. HTA has no cross-rank wait: it counts a collective kernel from its launch, "
    "its spin-wait for the other ranks included, as communication; here the wait is apart, and "
    "only the part the host sat through counts (a rank whose host never blocks on its "
    "collectives, as in FSDP2, waits for nobody). On a GPU trace, which records no wait, the "
    "union of the collective kernels' spans stands in for it (an upper bound)."
)
# A neuron collective records its wait (for the last rank to arrive) and its modeled transfer in
# args; a GPU trace's collective kernel has only its duration, which holds both.
COLLECTIVES = "kind = 'collective' AND layer = 'device'"
P2P = "p2p"  # the device name of a point-to-point send or receive (runtime/collectives.py)
# host spans in which the host waits: a collective's host call (an overlapped one lasts only its
# launch), the wait on an overlapped one, and device syncs
BLOCKED = f"layer = 'host' AND ((kind = 'runtime' AND name LIKE 'c10d::%') OR {sync_predicate()})"


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
    recorded: bool = True  # wait_ns recorded (a neuron capture); else the kernel's span
    blocked_ns: int | None = None  # the part of wait_ns its host was blocked for (with_blocked)

    @property
    def total_ns(self) -> int:
        """Its time as the rank lost it: the wait its host was blocked for, and the transfer."""
        wait = self.wait_ns if self.blocked_ns is None else self.blocked_ns
        return wait + self.transfer_ns

    def wait_span(self) -> tuple[int, int]:
        """[arrival, last arrival) for a recorded wait; the kernel's span on a GPU trace."""
        if self.recorded:
            return self.start_ns - self.wait_ns, self.start_ns
        return self.start_ns, self.start_ns + self.wait_ns


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
                recorded=recorded,
            )
        )
    return out


def _union(spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted [s, e) of `spans` (empty ones dropped)."""
    a = np.array([sp for sp in spans if sp[1] > sp[0]], dtype=np.int64).reshape(-1, 2)
    _, s, e = merge_arrays(np.zeros(len(a), np.int64), a[:, 0], a[:, 1])
    return s, e


def _overlap(s: np.ndarray, e: np.ndarray, lo: int, hi: int) -> int:
    """Time the disjoint sorted intervals (s, e) cover inside [lo, hi)."""
    i, j = np.searchsorted(e, lo, "right"), np.searchsorted(s, hi, "left")
    if i >= j:
        return 0
    return int(np.sum(np.minimum(e[i:j], hi) - np.maximum(s[i:j], lo)))


def _blocked(ctx: AnalysisContext) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """rank -> the union of its host spans that wait (BLOCKED)."""
    rows = ctx.rows(f"SELECT rank, start_ns, start_ns + dur_ns AS e FROM ev WHERE {BLOCKED}")
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for r in rows:
        by_rank.setdefault(int(r["rank"]), []).append((int(r["start_ns"]), int(r["e"])))
    return {rank: _union(spans) for rank, spans in by_rank.items()}


def with_blocked(ctx: AnalysisContext, cs: list[Collective]) -> list[Collective]:
    """`cs` with each recorded collective's `blocked_ns`: the part of its wait during which its
    rank's host was blocked (its wait interval against the union of the rank's waiting host
    spans). A GPU trace's collectives are left as they are."""
    blocked = _blocked(ctx) if any(c.recorded for c in cs) else {}
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    out = []
    for c in cs:
        if c.recorded:
            s, e = blocked.get(c.rank, empty)
            c = replace(c, blocked_ns=_overlap(s, e, *c.wait_span()))
        out.append(c)
    return out


def rank_waits(
    ctx: AnalysisContext, windows: list[dict], p2p: bool = True
) -> dict[tuple[int, int], int]:
    """(rank, start_ns) of each window -> the time in it the rank waited for the others (the
    module's definition: blocked host time while a collective waited; union, never a sum).
    `p2p=False` leaves point-to-point waits out (a pipeline stage waiting for its neighbour)."""
    cs = [c for c in collectives(ctx) if p2p or c.name != P2P]
    recorded = any(c.recorded for c in cs)
    blocked = _blocked(ctx) if recorded else {}
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    by_rank: dict[int, list[tuple[int, int]]] = {}
    for c in cs:
        by_rank.setdefault(c.rank, []).append(c.wait_span())
    windows_of: dict[int, list[dict]] = {}
    for w in windows:
        windows_of.setdefault(int(w["rank"]), []).append(w)
    out: dict[tuple[int, int], int] = {}
    for rank, mine in windows_of.items():
        ws, we = _union(by_rank.get(rank, []))
        if recorded:  # the waits the host sat through: intersect the two unions
            bs, be = blocked.get(rank, empty)
            pieces = [(max(a, b0), min(z, b1)) for a, z in zip(ws, we, strict=True)
                      for b0, b1 in _clip(bs, be, int(a), int(z))]  # fmt: skip
            ws, we = _union(pieces)
        for w in mine:
            lo = int(w["start_ns"])
            out[(rank, lo)] = _overlap(ws, we, lo, lo + int(w["dur_ns"]))
    return out


def _clip(s: np.ndarray, e: np.ndarray, lo: int, hi: int) -> list[tuple[int, int]]:
    i, j = np.searchsorted(e, lo, "right"), np.searchsorted(s, hi, "left")
    return [(int(a), int(b)) for a, b in zip(s[i:j], e[i:j], strict=True)]


def rank_step_waits(
    ctx: AnalysisContext, steady: bool = False, p2p: bool = True
) -> dict[int, list[RankStep]]:
    """rank -> its steps (real step windows only; `steady`: facts.steady_w's), each with the
    time it waited for the other ranks (`rank_waits`; `p2p` as there)."""
    if not ctx.has_steps:
        return {}
    windows = (ctx.steady_steps() if steady else ctx.steps()).to_pylist()
    waits = rank_waits(ctx, windows, p2p)
    out: dict[int, list[RankStep]] = {}
    for row in windows:
        rank, step = int(row["rank"]), int(row["step"])
        wait = waits.get((rank, int(row["start_ns"])), 0)
        out.setdefault(rank, []).append(RankStep(rank, step, int(row["dur_ns"]), wait))
    return out

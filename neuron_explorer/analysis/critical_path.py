"""The critical path of a step: the chain of host calls, device work and waits that sets its
length, walked back from the step's end through what each event waited for (replay.py keeps,
for every node, the node and edge that set its start). Its time splits into host, device
compute, DMA, collective wait and transfer, and its ops are ranked by their share of the step,
each with what the step would save were that op twice as fast (a replay, not a share).
`neuron-explorer critical-path` prints it; the web's Critical path view draws it."""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from ..errors import ExplorerError
from ..model.profile import Profile
from .depgraph import CATEGORIES, Graph, build_graph
from .page import PageModel
from .replay import Change, Schedule, replay

TOP_OPS = 25  # ops listed
WHATIF_OPS = 8  # the top device ops each get a replay at twice their speed
SPEEDUP = 2.0


@dataclass(frozen=True)
class Segment:
    """A piece of the critical path: an event's own time, or the time before it that the
    edge it waited on accounts for (host work between calls, a launch's latency)."""

    event_id: int
    rank: int
    label: str  # the op (device work), the span (host time), the call (host calls)
    category: str  # one of depgraph.CATEGORIES
    edge: str  # what led to it: the edge kind, or "own" for the event's own time
    track: str
    start_ns: int
    dur_ns: int
    module: str | None = None
    src: str | None = None


@dataclass(frozen=True)
class PathOp:
    """An op (or host span) on the critical path, with its share of the step."""

    label: str
    category: str
    dur_ns: int
    share: float
    segments: int
    saving_if_2x_ns: int | None  # the replayed step's drop were it twice as fast


@dataclass(frozen=True)
class CriticalPath(PageModel):
    profile: str
    label: str  # "step 3", "whole trace", or an annotation's instance
    rank: int
    start_ns: int  # the window's start
    step_ns: int  # the step as replayed (its recorded host window, or later device work)
    path_ns: int
    by_category: dict[str, int]
    ops: tuple[PathOp, ...]
    segments: tuple[Segment, ...]  # in time order
    edges: dict[str, int]  # the graph's edges by kind
    nodes: int
    modeled: bool


def critical_path(
    profile: Profile, step: int | None = None, annotation: str | None = None,
    instance: int = 0, rank: int | None = None,
) -> CriticalPath:  # fmt: skip
    """The critical path of one step (the median one by default) on `rank` (the slowest)."""
    graph = build_graph(profile, step, annotation, instance)
    return path_of(graph, str(profile.path), rank)


def path_of(graph: Graph, profile: str, rank: int | None = None) -> CriticalPath:
    sched = replay(graph)
    if rank is None:
        rank = max(sched.step_ns, key=lambda r: (sched.step_ns[r], -r))
    if rank not in sched.step_ns:
        raise ExplorerError(f"{profile}: no rank {rank} in {graph.label} "
                            f"(ranks {', '.join(map(str, sorted(sched.step_ns)))})")  # fmt: skip
    segs = walk(graph, sched, rank)
    by_cat = dict.fromkeys(CATEGORIES, 0)
    for s in segs:
        by_cat[s.category] += s.dur_ns
    step = sched.step_ns[rank]
    ops = _ops(graph, segs, step)
    edges: dict[str, int] = defaultdict(int)
    for e in graph.edges:
        edges[e.kind] += 1
    return CriticalPath(profile, graph.label, rank, graph.windows[rank].start_ns, step,
                        sum(s.dur_ns for s in segs), by_cat, ops, tuple(segs), dict(edges),
                        len(graph.nodes), graph.modeled)  # fmt: skip


def walk(graph: Graph, sched: Schedule, rank: int) -> list[Segment]:
    """The critical path of `rank`'s step, in time order."""
    nodes, win = graph.nodes, graph.windows[rank]
    out: list[Segment] = []
    own_dev = [d for d in range(len(nodes)) if not nodes[d].host and nodes[d].rank == rank
               and (sched.end[d] or sched.start[d])]  # fmt: skip
    last_dev = max(own_dev, key=lambda d: sched.end[d], default=None)
    cur: int | None
    if last_dev is not None and sched.end[last_dev] > sched.host_end[rank]:
        cur, upto = last_dev, sched.end[last_dev]
    else:
        cur = sched.host_tail_from[rank]
        before = sched.end[cur] if cur is not None else win.start_ns
        o_from = nodes[cur].end_ns if cur is not None else win.start_ns
        track = nodes[cur].track if cur is not None else "host"
        _host_gap(out, win, rank, o_from, win.end_ns, before, sched.host_end[rank] - before,
                  track=track)  # fmt: skip
        upto = before
    seen, at_rank = 0, rank
    while cur is not None and seen <= 4 * len(nodes):
        seen += 1
        at_rank = nodes[cur].rank
        cur, upto = _step(graph, sched, cur, upto, out)
    other = graph.windows[at_rank].start_ns
    if other > win.start_ns:  # the path ends on a rank whose step began later
        out.append(Segment(-1, at_rank, f"(rank {at_rank}'s step began later)", "host",
                           "collective", "host", win.start_ns, other - win.start_ns))  # fmt: skip
    out.reverse()
    return [s for s in out if s.dur_ns > 0]


def _step(graph: Graph, sched: Schedule, cur: int, upto: int, out: list[Segment]):
    """Add `cur`'s part of the path (up to `upto`) and return the next (node, upto)."""
    nodes = graph.nodes
    x = nodes[cur]
    win = graph.windows[x.rank]
    start = sched.start[cur]
    if cur in sched.begin:
        begin, who = sched.begin[cur]
        arrived = sched.arrival.get(cur, start)
        if upto > begin:
            out.append(_seg(x, "own", "transfer", begin, upto - begin))
        if who == -1:  # a rank outside the profile arrived last
            out.append(_seg(x, "collective wait", "collective wait", arrived, begin - arrived))
        elif who != cur:  # the path goes on on the rank that arrived last
            return who, sched.arrival.get(who, sched.start[who])
        upto, start = arrived, arrived
    pred, kind = sched.bound_by[cur]
    pred_end = sched.end[pred] if pred is not None else win.start_ns
    own_from = max(start, pred_end)
    if upto > own_from:
        cat = x.category
        if x.kind == "sync" and kind == "sync":
            out.append(_seg(x, "own", "host", own_from, upto - own_from))  # after the device
        else:
            out.append(_seg(x, "own", cat, own_from, upto - own_from))
    gap = min(upto, start) - pred_end
    if gap > 0:
        if kind == "earlier":  # the queue still ran an earlier step's work
            _earlier(out, x, win, pred, pred_end, gap)
        elif kind == "launch" and not x.host:  # from the launch call to the work starting
            out.append(Segment(x.event_id, x.rank, f"{x.op_name or x.name} (launch latency)",
                               "host", kind, x.track, pred_end, gap, x.module, x.src))  # fmt: skip
        elif x.host:
            o_from = nodes[pred].end_ns if pred is not None else win.start_ns
            _host_gap(out, win, x.rank, o_from, x.start_ns, pred_end, gap, kind, x.track)
        else:
            out.append(_seg(x, kind, x.category, pred_end, gap))
    return pred, min(pred_end, upto)  # its part ends where this one picks up


def _earlier(out: list[Segment], x, win, pred: int | None, pred_end: int, gap: int) -> None:
    """The wait of device work `x` behind other steps' work on its queue: that work's run
    (where it kept the queue busy without a gap), and before it, from `x`'s launch, the launch
    latency (a trimmed trace's queue may sit idle long before the run)."""
    run = pred_end if pred is None else max(pred_end, win.busy_from(x.track, x.start_ns))
    run = min(run, pred_end + gap)
    out.append(Segment(-1, x.rank, "(earlier steps' device work)", "device compute", "earlier",
                       x.track, run, pred_end + gap - run))  # fmt: skip
    if run > pred_end:
        out.append(Segment(x.event_id, x.rank, f"{x.op_name or x.name} (launch latency)", "host",
                           "launch", x.track, pred_end, run - pred_end, x.module, x.src))  # fmt: skip


def _seg(x, edge: str, category: str, start: int, dur: int) -> Segment:
    label = x.op_name or x.name if not x.host or x.kind == "launch" else x.name
    if x.host and x.kind == "launch":
        label = f"{x.op_name or x.name} (launch)"
    return Segment(x.event_id, x.rank, str(label), category, edge, x.track, start, max(dur, 0),
                   x.module, x.src)  # fmt: skip


def _host_gap(out, win, rank: int, o_from: int, o_to: int, start: int, dur: int,
              edge: str = "program", track: str = "host") -> None:  # fmt: skip
    """Host time between two calls, named by the innermost framework span around it."""
    if dur <= 0:
        return
    mid = (o_from + o_to) // 2
    best = _innermost(win, mid)
    if best is None:
        out.append(Segment(-1, rank, "(host, outside any op)", "host", edge, track, start, dur))
    else:
        out.append(Segment(best[2], rank, best[3], "host", edge, track, start, dur, best[4],
                           best[5]))  # fmt: skip


def _innermost(win, t: int):
    """The latest-started span that holds `t`: the innermost, as spans nest (a walk back over
    the spans that ended before it)."""
    spans, starts = win.spans, win.span_starts
    i = bisect.bisect_right(starts, t) - 1
    while i >= 0:
        if spans[i][1] > t:
            return spans[i]
        i -= 1
    return None


def _ops(graph: Graph, segs: list[Segment], step: int) -> tuple[PathOp, ...]:
    agg: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for s in segs:
        a = agg[(s.label, s.category)]
        a[0] += s.dur_ns
        a[1] += 1
    ranked = sorted(agg.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_OPS]
    base = max(replay(graph).step_ns.values(), default=0)
    out, replayed = [], 0
    for (label, cat), (dur, n) in ranked:
        saving = None
        device = cat not in ("host", "collective wait") and not label.startswith("(")
        if device and replayed < WHATIF_OPS:
            replayed += 1
            change = speedup_change(graph, lambda x, lb=label: (x.op_name or x.name) == lb,
                                    SPEEDUP, f"{label} {SPEEDUP:g}x")  # fmt: skip
            saving = base - max(replay(graph, change).step_ns.values(), default=0)
        out.append(PathOp(label, cat, dur, round(dur / step, 6) if step else 0.0, n, saving))
    return tuple(out)


def speedup_change(graph: Graph, match, factor: float, what: str) -> Change:
    """A change making the device work that `match`es `factor` times faster."""
    durations = {n.event_id: round(n.dur_ns / factor) for n in graph.nodes
                 if not n.host and match(n)}  # fmt: skip
    return Change(what, durations)

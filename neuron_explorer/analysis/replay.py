"""Replay: re-time a step's dependency graph (depgraph.py) with a change applied, by the rules
the events followed when they were recorded: the host runs its program in order with the time
between its calls kept, each queue runs its work in launch order (a kernel starts at the later
of its launch and the queue's previous work; a compiled graph's kernels move as one unit), a
waiting host call ends when what it waits for ends, and a collective starts when its last rank
arrives. Whatever the recording shows beyond those rules (a launch's latency, a copy's tail
after the device is done) is kept as it was, so replaying no change gives the step back exactly.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .depgraph import Graph, Node, Window, collective_peers, queue_order

MAX_ROUNDS = 8  # ranks re-timed in turn until their collectives agree


@dataclass(frozen=True)
class Change:
    """What a replay changes: new durations for some events (device work, host calls), host
    syncs that no longer wait (nor cost), and host time removed (rank, start_ns, end_ns)."""

    what: str = "no change"
    durations: Mapping[int, int] = field(default_factory=dict)  # event id -> new dur_ns
    drop_syncs: frozenset[int] = frozenset()  # host sync event ids
    drop_host: tuple[tuple[int, int, int], ...] = ()
    # drop_host as an array sorted by rank, made on its first replay (a finding's change is
    # replayed on each of its steps), and let go with the change
    _by_rank: Any = field(default=None, init=False, compare=False, repr=False)

    def __add__(self, other: Change) -> Change:
        return Change(
            f"{self.what}; {other.what}" if self.durations or self.drop_syncs or self.drop_host
            else other.what,
            {**self.durations, **other.durations},
            self.drop_syncs | other.drop_syncs,
            self.drop_host + other.drop_host,
        )  # fmt: skip


@dataclass
class Schedule:
    """A replayed step: each node's new start and end, the node and edge kind that set its
    start (None: the window's start), and each rank's step end and length."""

    start: list[int]
    end: list[int]
    bound_by: list[tuple[int | None, str]]
    host_end: dict[int, int]  # rank -> the host window's replayed end
    host_tail_from: dict[int, int | None]  # rank -> the host node the tail follows
    step_end: dict[int, int]
    step_ns: dict[int, int]
    arrival: dict[int, int] = field(default_factory=dict)  # collective node -> arrival
    # collective node -> (when its transfer began, who arrived last: the node itself, a peer
    # node, or -1 for a rank outside the profile)
    begin: dict[int, tuple[int, int]] = field(default_factory=dict)


class _Removed:
    """Host time removed on one rank: the measure of its union inside any interval."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for s, e in sorted(spans):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            elif e > s:
                merged.append([s, e])
        self.starts = [s for s, _ in merged]
        self.ends = [e for _, e in merged]
        self.prefix = [0]
        for s, e in merged:
            self.prefix.append(self.prefix[-1] + e - s)

    def _upto(self, t: int) -> int:
        i = bisect.bisect_right(self.starts, t)
        if i == 0:
            return 0
        return self.prefix[i - 1] + min(t, self.ends[i - 1]) - self.starts[i - 1]

    def within(self, a: int, b: int) -> int:
        return self._upto(b) - self._upto(a) if b > a and self.starts else 0


def replay(graph: Graph, change: Change | None = None) -> Schedule:
    """The step re-timed with `change` (none: the step as recorded)."""
    change = change or Change()
    n = len(graph.nodes)
    sched = Schedule([0] * n, [0] * n, [(None, "start")] * n, {}, {}, {}, {})
    peers = collective_peers(graph)
    arrival = {i: graph.nodes[i].start_ns for ids in peers.values() for i in ids}
    removed = _removed_by_rank(graph, change)
    for _ in range(MAX_ROUNDS):
        before = dict(arrival)
        for win in graph.windows.values():
            _rank(graph, win, change, sched, peers, arrival, removed[win.rank])
        if arrival == before:
            break
    sched.arrival = arrival
    return sched


def _dur(node: Node, change: Change) -> int:
    return max(int(change.durations.get(node.event_id, node.dur_ns)), 0)


def _removed_by_rank(graph: Graph, change: Change) -> dict:
    """rank -> the host time removed on it, as `_rank` measures it: of the change's spans
    (those of the whole profile, every rank; sorted by rank once a change), the ones that meet
    the rank's window (from its start or first host call to its end or last host call's end; a
    span outside that changes no measure taken inside it), so a replay of a step costs its
    ranks' spans, not every span once a rank and round."""
    import numpy as np

    nodes, spans = graph.nodes, change._by_rank
    if spans is None:
        a = np.array(change.drop_host, dtype=np.int64).reshape(-1, 3)
        spans = a[np.argsort(a[:, 0], kind="stable")]
        object.__setattr__(change, "_by_rank", spans)  # frozen: a cache of its own field
    out = {}
    for rank, win in graph.windows.items():
        lo = min([win.start_ns, *(nodes[h].start_ns for h in win.host)])
        hi = max([win.end_ns, *(nodes[h].end_ns for h in win.host)])
        i, j = np.searchsorted(spans[:, 0], [rank, rank + 1])
        s, e = spans[i:j, 1], spans[i:j, 2]
        meet = (e > lo) & (s < hi)
        out[rank] = _Removed(list(zip(s[meet].tolist(), e[meet].tolist(), strict=True)))
    return out


def _rank(graph: Graph, win: Window, change: Change, sched: Schedule,
          peers: dict[tuple, list[int]], arrival: dict[int, int],
          removed: _Removed) -> None:  # fmt: skip
    nodes = graph.nodes
    q = _Queues(nodes, win, change, sched, peers, arrival)
    f_orig = f_new = win.start_ns
    f_node: int | None = None
    items = sorted([(nodes[h].start_ns, 0, h) for h in win.host]
                   + [(nodes[d].start_ns, 1, d) for d in win.orphans])  # fmt: skip
    for _, is_orphan, i in items:
        x = nodes[i]
        if is_orphan:
            q.schedule([i], x.start_ns, x.start_ns, None)
            continue
        if x.start_ns >= f_orig:
            s = f_new + (x.start_ns - f_orig) - removed.within(f_orig, x.start_ns)
        else:  # overlaps the host work before it (another thread)
            s = f_new - (f_orig - x.start_ns)
        sched.bound_by[i] = (f_node, "program")
        dropped = x.event_id in change.drop_syncs
        dur = 0 if dropped else _dur(x, change) - removed.within(x.start_ns, x.end_ns)
        e = s + max(dur, 0)
        own = win.launched.get(i, ()) if x.kind == "sync" else ()
        if own:  # a synchronize's own device side (CUDA's Stream Sync) waits on its queue
            q.schedule(list(own), s, x.start_ns, i)
        if x.kind == "sync" and not dropped:
            dep = q.waited(i, win.waits_for.get(i, "all"), own)
            if dep is not None:
                dep_new, dep_orig, dep_node = dep
                wait = x.wait_ns or min(max(dep_orig - x.start_ns, 0), x.dur_ns)
                own_ns = max(dur - wait, 0)
                post = x.end_ns - dep_orig
                e = s + own_ns
                if dep_new + post > e:
                    e = dep_new + post
                    sched.bound_by[i] = (dep_node, "sync")
        elif i in win.launched:
            q.schedule(list(win.launched[i]), e, x.end_ns, i)
        sched.start[i], sched.end[i] = s, e
        if x.end_ns >= f_orig or e >= f_new:
            f_orig, f_new = max(f_orig, x.end_ns), max(f_new, e)
            f_node = i
    tail = win.end_ns - f_orig
    host_end = f_new + max(tail, 0) - removed.within(f_orig, win.end_ns)
    sched.host_end[win.rank] = host_end
    sched.host_tail_from[win.rank] = f_node
    sched.step_end[win.rank] = max(host_end, q.last_end)
    sched.step_ns[win.rank] = sched.step_end[win.rank] - win.start_ns


class _Queues:
    """The device queues of one rank while the host replays: where each track is free."""

    def __init__(self, nodes, win, change, sched, peers, arrival) -> None:
        self.nodes, self.win, self.change, self.sched = nodes, win, change, sched
        self.peers, self.arrival = peers, arrival
        self.free_new: dict[str, int] = {}
        self.free_orig: dict[str, int] = {}
        self.free_node: dict[str, int | None] = {}
        self.free_kind: dict[str, str] = {}  # the edge a wait on the track is: queue, stream_wait
        self.done: list[int] = []  # scheduled device nodes, in order
        self.all_new = self.all_orig = -(1 << 62)
        self.all_node: int | None = None
        self.coll: tuple[int, int, int | None] = (-(1 << 62), -(1 << 62), None)
        self.last_end = win.start_ns

    def schedule(self, devs: list[int], ready_new: int, ready_orig: int, launch: int | None):
        first_of: dict[str, int] = {}
        for d in devs:
            x = self.nodes[d]
            if x.neff is not None and x.neff in first_of:
                self._in_unit(d, first_of[x.neff])
            else:
                self._on_queue(d, ready_new, ready_orig, launch)
                if x.neff is not None:
                    first_of[x.neff] = d
            self._done(d)

    def _on_queue(self, d: int, ready_new: int, ready_orig: int, launch: int | None) -> None:
        x, sched = self.nodes[d], self.sched
        t = x.track
        floor = self.win.busy_until(t, x.start_ns)  # other steps' work, where it ran
        q_new = max(self.free_new.get(t, -(1 << 62)), floor)
        q_orig = max(self.free_orig.get(t, -(1 << 62)), floor)
        base_orig, base_new, bound = ready_orig, ready_new, (launch, "launch")
        if q_new > base_new:
            own_q = self.free_new.get(t, -(1 << 62))
            kind = self.free_kind.get(t, "queue")
            # behind other steps' work: the path goes on through the launch (critical_path
            # names the wait from the launch to that work's run as launch latency)
            bound = (self.free_node.get(t), kind) if own_q >= floor else (launch, "earlier")
            base_new = q_new
        base_orig = max(base_orig, q_orig)
        dep = self.win.stream_waits.get(d)
        if dep is not None:
            base_orig = max(base_orig, self.nodes[dep].end_ns)
            if sched.end[dep] > base_new:
                base_new, bound = sched.end[dep], (dep, "stream_wait")
        # a collective's recorded start is when its last rank arrived: it arrived wait_ns before
        at = x.start_ns - x.wait_ns
        s = base_new + (at - base_orig)
        s = max(s, q_new + min(0, at - q_orig))  # never more overlap than recorded
        dur = _dur(x, self.change)
        if x.kind == "collective":
            self.arrival[d] = s
            s, e = self._collective(d, s, dur)
        else:
            e = s + dur
        sched.start[d], sched.end[d], sched.bound_by[d] = s, e, bound
        self._advance(t, d, x.end_ns, e)
        if dep is not None:  # the trace dates a stream's wait when it is queued: the wait
            # holds the work queued after it until the recorded stream's work is done
            self.free_orig[t] = max(self.free_orig[t], self.nodes[dep].end_ns)
            if sched.end[dep] >= self.free_new[t]:
                self.free_new[t], self.free_node[t] = sched.end[dep], dep
                self.free_kind[t] = "stream_wait"

    def _collective(self, d: int, s: int, dur: int) -> tuple[int, int]:
        """A collective's transfer: from its last rank's arrival, for as long as recorded."""
        x, nodes = self.nodes[d], self.nodes
        ids = self.peers.get(x.collective_key, [d])
        complete = len(ids) >= max(x.world_size, 2 if len(ids) > 1 else x.world_size or 1)
        fixed = -(1 << 62)
        if not complete:  # peers outside the profile: they arrive when they did
            fixed = max(nodes[i].start_ns for i in ids)
        begin_orig = max(fixed, *(nodes[i].start_ns - nodes[i].wait_ns for i in ids))
        begin, who = s, d
        for i in ids:
            if i != d and self.arrival.get(i, s) > begin:
                begin, who = self.arrival[i], i
        if fixed > begin:
            begin, who = fixed, -1
        post = x.end_ns - begin_orig
        if x.dur_ns > 0 and dur != x.dur_ns:
            post = round(post * dur / x.dur_ns)
        self.sched.begin[d] = (begin, who)
        return begin, begin + post

    def _in_unit(self, d: int, first: int) -> None:
        """A later kernel of a NEFF: after the unit's work before it, as recorded."""
        x, sched, nodes = self.nodes[d], self.sched, self.nodes
        unit = [i for i in self.done if nodes[i].neff == x.neff and nodes[i].flow_id == x.flow_id
                and i >= first]  # fmt: skip
        f_orig = max(nodes[i].end_ns for i in unit)
        f_i = max(unit, key=lambda i: sched.end[i])
        if x.start_ns >= f_orig:
            s = sched.end[f_i] + (x.start_ns - f_orig)
            bound = (f_i, "neff")
        else:  # overlaps the unit's earlier kernels, as the NEFF schedules them
            prev = unit[-1]
            s = sched.start[prev] + (x.start_ns - nodes[prev].start_ns)
            bound = (first, "neff")
        e = s + _dur(x, self.change)
        sched.start[d], sched.end[d], sched.bound_by[d] = s, e, bound
        self._advance(x.track, d, x.end_ns, e)

    def _advance(self, track: str, d: int, end_orig: int, end_new: int) -> None:
        if end_new >= self.free_new.get(track, -(1 << 62)):
            self.free_new[track] = end_new
            self.free_node[track] = d
            self.free_kind[track] = "queue"
        self.free_orig[track] = max(self.free_orig.get(track, -(1 << 62)), end_orig)

    def _done(self, d: int) -> None:
        self.done.append(d)
        x, end = self.nodes[d], self.sched.end[d]
        self.last_end = max(self.last_end, end)
        if end >= self.all_new:
            self.all_node = d
        self.all_new, self.all_orig = max(self.all_new, end), max(self.all_orig, x.end_ns)
        if x.kind == "collective":
            c_new, c_orig, c_node = self.coll
            self.coll = (max(c_new, end), max(c_orig, x.end_ns), d if end >= c_new else c_node)

    def waited(self, i: int, what: str, own) -> tuple[int, int, int] | None:
        """(new end, recorded end, node) of what host call `i` waits for."""
        if what == "own" and own:
            last = max(own, key=lambda d: self.sched.end[d])
            return self.sched.end[last], max(self.nodes[d].end_ns for d in own), last
        if what == "collectives":
            c_new, c_orig, c_node = self.coll
            return None if c_node is None else (c_new, c_orig, c_node)
        if self.all_node is None:
            return None
        return self.all_new, self.all_orig, self.all_node


def step_ns(graph: Graph, change: Change | None = None) -> int:
    """The replayed step's length: its longest rank."""
    return max(replay(graph, change).step_ns.values(), default=0)


def device_order(graph: Graph) -> list[int]:
    """Every rank's device nodes in the order they are scheduled."""
    return [d for w in graph.windows.values() for d in queue_order(w)]

"""The dependency graph of a step: what each event of the step waited for, read from the
profile's events, the one model that critical_path.py walks and replay.py re-times.

Nodes are the events whose timing the step's length depends on: on the host, the launches
(runtime calls with a flow to device work) and the calls that wait for the device (syncs,
`.item()`, blocking copies, `c10d::wait`, CUDA's synchronize calls), in program order over the
rank's threads (autograd's backward thread runs while the main thread waits in backward(), so
one order holds them all); on the device, each queue's work (the neuron `kernels` queue, the CC
queue, each CUDA stream) in launch order. Host time between two host nodes is kept as it was,
so the program's own work moves only where what it waits for moves.

Edges, each with its kind: `program` (host order), `launch` (a launch to its device work),
`queue` (the previous work on the same queue), `neff` (a kernel of a compiled graph to the
first kernel of the same NEFF: one unit on the queue), `sync` (device work a host call waits
for), `stream_wait` (cudaStreamWaitEvent: a stream waits for work recorded on another) and
`collective` (a collective waits for its peers on the other ranks).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..errors import ExplorerError
from ..model.profile import Profile
from ..vocab.kinds import FRAMEWORK_KINDS
from .conventions import NEURON_COPY_KIND, NEURON_SYNC_KIND, SYNC_RUNTIME_NAMES
from .windows import Window, median_step, read_events, windows_of

# host runtime calls that wait for every queue (the others wait for their own queue's work)
WAIT_ALL_NAMES = ("cudaDeviceSynchronize", "hipDeviceSynchronize", "cuCtxSynchronize")
COLLECTIVE_WAIT_NAMES = ("c10d::wait",)  # waits for the collectives launched before it
STREAM_WAIT_NAMES = ("cudaStreamWaitEvent", "hipStreamWaitEvent")
EVENT_RECORD_NAMES = ("cudaEventRecord", "hipEventRecord")
EDGE_KINDS = ("program", "launch", "queue", "neff", "sync", "stream_wait", "collective")
# what a node's time is, for the critical path's split
CATEGORIES = ("host", "device compute", "dma", "collective wait", "transfer")


@dataclass
class Node:
    """One event of the graph (mutable only while the graph is built)."""

    index: int
    event_id: int
    rank: int
    host: bool
    kind: str  # launch | sync | record | device | collective
    name: str
    op_name: str | None
    module: str | None
    src: str | None  # file:line of the user's code
    track: str
    start_ns: int
    dur_ns: int
    category: str  # one of CATEGORIES
    wait_ns: int = 0  # host: the part of dur_ns spent waiting for the device (recorded)
    neff: str | None = None
    flow_id: int | None = None
    collective_key: tuple | None = None
    world_size: int = 0  # a collective's ranks (0: unknown)
    shapes: str | None = None
    dtypes: str | None = None

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass(frozen=True)
class Edge:
    src: int  # node index
    dst: int
    kind: str  # one of EDGE_KINDS


@dataclass
class Graph:
    """The dependency graph of one step on every rank (windows[rank])."""

    nodes: list[Node]
    windows: dict[int, Window]
    edges: list[Edge]
    modeled: bool  # a neuron capture: device times come from the cost model
    label: str  # "step 3", or the annotation's name

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "nodes": [_node_dict(n) for n in self.nodes],
            "edges": [{"src": e.src, "dst": e.dst, "kind": e.kind} for e in self.edges],
        }


def _node_dict(n: Node) -> dict[str, Any]:
    return {"index": n.index, "event_id": n.event_id, "rank": n.rank, "kind": n.kind,
            "name": n.name, "op_name": n.op_name, "track": n.track, "start_ns": n.start_ns,
            "dur_ns": n.dur_ns, "category": n.category}  # fmt: skip


def _args(text: Any) -> dict[str, Any]:
    if not text:
        return {}
    try:
        out = json.loads(text)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def build_graph(
    profile: Profile, step: int | None = None, annotation: str | None = None, instance: int = 0
) -> Graph:
    """The dependency graph of one step on every rank: `step` (the median-length step when
    None), or the `instance`-th span named `annotation` (counted from 0)."""
    wins = windows_of(profile, annotation)
    if annotation is not None:
        per_rank: dict[int, list] = defaultdict(list)
        for w in wins:
            per_rank[w[0]].append(w)
        if any(instance >= len(v) or instance < 0 for v in per_rank.values()):
            n = min(len(v) for v in per_rank.values())
            raise ExplorerError(f"{profile.path}: {annotation!r} has {n} instance(s); "
                                f"--instance {instance} is out of range")  # fmt: skip
        chosen = [v[instance] for v in per_rank.values()]
        label = f"{annotation} #{instance}"
    else:
        if step is None:
            step = median_step(wins)
        chosen = [w for w in wins if w[1] == step]
        if not chosen:
            known = sorted({w[1] for w in wins if w[1] is not None})
            raise ExplorerError(f"{profile.path}: no step {step} (steps: "
                                f"{', '.join(map(str, known)) or 'none'})")  # fmt: skip
        label = "whole trace" if step is None else f"step {step}"
    rows = read_events(profile, chosen)
    return _assemble(profile, rows, chosen, label)


def _assemble(profile: Profile, rows: list[dict[str, Any]], chosen: list, label: str) -> Graph:
    nodes: list[Node] = []
    edges: list[Edge] = []
    windows: dict[int, Window] = {}
    for r, step, s, e in chosen:
        windows[int(r)] = Window(int(r), step, int(s), int(e))
    launches: dict[tuple[int, int], int] = {}  # (rank, flow) -> host node
    records: dict[tuple[int, int], int] = {}  # (rank, correlation) -> event-record node
    device_rows = []
    for row in rows:
        if row["layer"] == "device":
            device_rows.append(row)
            continue
        if row["kind"] in FRAMEWORK_KINDS:  # they name host time on the critical path
            src = f"{row['src_file']}:{row['src_line']}" if row["src_file"] else None
            windows[int(row["rank"])].spans.append(
                (
                    int(row["start_ns"]),
                    int(row["start_ns"]) + int(row["dur_ns"]),
                    int(row["id"]),
                    str(row["name"]),
                    row["module"],
                    src,
                )
            )
            continue
        node = _host_node(len(nodes), row)
        if node is None:
            continue
        nodes.append(node)
        win = windows[node.rank]
        win.host.append(node.index)
        if node.kind == "launch" and row["flow_id"] is not None:
            launches[(node.rank, int(row["flow_id"]))] = node.index
        if node.kind == "record":
            corr = _args(row["args"]).get("correlation")
            if corr is not None:
                records[(node.rank, int(corr))] = node.index
    flows = _device_nodes(nodes, windows, device_rows, launches)
    for win in windows.values():
        win.spans.sort()
        win.span_starts = [sp[0] for sp in win.spans]
        _host_edges(nodes, win, edges)
        for launch, devs in win.launched.items():
            edges.extend(Edge(launch, d, "launch") for d in devs)
        _queue_edges(nodes, win, edges)
        _stream_waits(nodes, win, flows, records, edges)
    return Graph(nodes, windows, edges, _modeled(profile), label)


def _modeled(profile: Profile) -> bool:
    return profile.manifest.source == "capture" or bool(profile.manifest.device_spec)


def _host_node(index: int, row: dict[str, Any]) -> Node | None:
    kind, name = row["kind"], str(row["name"])
    args = _args(row["args"])
    if kind == "runtime" and row["flow_id"] is not None:
        # a collective not overlapped with compute (point-to-point) blocks until it is done
        blocking = "collective" in args and args.get("overlapped") is False
        role = "sync" if name in SYNC_RUNTIME_NAMES or blocking else "launch"
    elif kind == NEURON_SYNC_KIND or (kind == "runtime" and name in SYNC_RUNTIME_NAMES):
        role = "sync"
    elif kind == NEURON_COPY_KIND and int(args.get("wait_ns") or 0) > 0:
        role = "sync"
    elif kind == "runtime" and name in COLLECTIVE_WAIT_NAMES:
        role = "sync"
    elif kind == "runtime" and name in EVENT_RECORD_NAMES:
        role = "record"
    else:
        return None
    if role == "launch" and name in STREAM_WAIT_NAMES:
        role = "launch"  # its device side is a queued wait (stream_waits)
    src = f"{row['src_file']}:{row['src_line']}" if row["src_file"] else None
    return Node(index, int(row["id"]), int(row["rank"]), True, role, name, row["op_name"],
                row["module"], src, str(row["track"]), int(row["start_ns"]), int(row["dur_ns"]),
                "host", wait_ns=min(int(args.get("wait_ns") or 0), int(row["dur_ns"])),
                flow_id=None if row["flow_id"] is None else int(row["flow_id"]))  # fmt: skip


def _device_category(kind: str, name: str) -> str:
    if kind == "collective" or name.startswith(("nccl", "rccl")):
        return "transfer"
    if kind in ("gpu_memcpy", "gpu_memset"):
        return "dma"
    return "device compute"


def _device_nodes(nodes: list[Node], windows: dict[int, Window], rows: list[dict[str, Any]],
                  launches: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:  # fmt: skip
    """Add the windows' device work (what their launches caused, or what started inside them
    unlaunched) and each track's earlier work's end; returns (rank, flow) -> device node."""
    flows: dict[tuple[int, int], int] = {}
    ordinal: dict[tuple[int, str], int] = defaultdict(int)
    for row in rows:
        rank = int(row["rank"])
        win = windows[rank]
        flow = None if row["flow_id"] is None else int(row["flow_id"])
        launch = launches.get((rank, flow)) if flow is not None else None
        start, dur = int(row["start_ns"]), int(row["dur_ns"])
        inside = launch is not None or (flow is None and win.start_ns <= start < win.end_ns)
        track = str(row["track"])
        if not inside:
            if row["kind"] == "sync":  # a stream's sync or wait holds no queue: no work of its own
                continue
            starts, ends = win.foreign.setdefault(track, ([], []))
            starts.append(start)  # rows come in start order
            ends.append(max(start + dur, ends[-1] if ends else start + dur))
            continue
        args = _args(row["args"])
        name = str(row["name"])
        kind = "collective" if row["kind"] == "collective" or name.startswith("nccl") else "device"
        src = f"{row['src_file']}:{row['src_line']}" if row["src_file"] else None
        node = Node(len(nodes), int(row["id"]), rank, False, kind, name, row["op_name"],
                    row["module"], src, track, start, dur, _device_category(row["kind"], name),
                    neff=args.get("neff"), flow_id=flow, shapes=row["shapes"],
                    dtypes=row["dtypes"])  # fmt: skip
        if row["kind"] == "sync":
            node.kind, node.category = "device", "host"  # a stream's wait: no work of its own
            if "wait_on_stream" in args:
                rec = args.get("wait_on_cuda_event_record_corr_id")
                win.pending_waits[node.index] = (f"stream {args['wait_on_stream']}",
                                                 -1 if rec is None else int(rec))  # fmt: skip
        if kind == "collective":
            node.collective_key = _collective_key(rank, name, args, nodes, launch, ordinal)
            node.wait_ns = int(args.get("wait_ns") or 0)
            node.world_size = int(args.get("world_size") or 0)
        nodes.append(node)
        if flow is not None:
            flows.setdefault((rank, flow), node.index)
        if launch is not None:
            win.launched.setdefault(launch, []).append(node.index)
        else:
            win.orphans.append(node.index)
    return flows


def _collective_key(rank: int, name: str, args: dict[str, Any], nodes: list[Node],
                    launch: int | None, ordinal: dict) -> tuple:  # fmt: skip
    """What names one collective on every rank: its sequence number, else its place among the
    rank's collectives of that name; a point-to-point transfer by its sender, its receiver and
    its place among theirs."""
    peer = args.get("peer")
    if peer is not None and launch is not None:
        recv = "recv" in nodes[launch].name
        pair = (int(peer), rank) if recv else (rank, int(peer))
        k = ordinal[pair]
        ordinal[pair] += 1
        return ("p2p", *pair, k)
    if args.get("seq") is not None:
        return (name, str(args.get("group")), int(args["seq"]))
    k = ordinal[(rank, name)]
    ordinal[(rank, name)] += 1
    return (name, k)


def _host_edges(nodes: list[Node], win: Window, edges: list[Edge]) -> None:
    """Program order, and what each waiting host call waits for."""
    for a, b in zip(win.host, win.host[1:], strict=False):
        edges.append(Edge(a, b, "program"))
    launched_before: list[int] = []
    for i in win.host:
        n = nodes[i]
        if n.kind == "sync":
            own = win.launched.get(i)
            if own and n.name not in WAIT_ALL_NAMES:
                win.waits_for[i] = "own"
                edges.extend(Edge(d, i, "sync") for d in own)
            else:
                what = "collectives" if n.name in COLLECTIVE_WAIT_NAMES else "all"
                win.waits_for[i] = what
                deps = [d for d in launched_before
                        if what == "all" or nodes[d].kind == "collective"]  # fmt: skip
                if deps:
                    edges.append(Edge(max(deps, key=lambda d: nodes[d].end_ns), i, "sync"))
        launched_before.extend(win.launched.get(i, ()))


def _queue_edges(nodes: list[Node], win: Window, edges: list[Edge]) -> None:
    last: dict[str, int] = {}
    first_of_neff: dict[tuple[int | None, str], int] = {}
    for d in queue_order(win):
        n = nodes[d]
        if n.neff is not None:
            key = (n.flow_id, n.neff)
            if key in first_of_neff:
                edges.append(Edge(first_of_neff[key], d, "neff"))
                continue
            first_of_neff[key] = d
        if n.track in last:
            edges.append(Edge(last[n.track], d, "queue"))
        last[n.track] = d


def queue_order(win: Window) -> list[int]:
    """The window's device nodes in the order they are scheduled: each launch's work in
    program order, work launched elsewhere where it started."""
    out: list[int] = []
    for h in win.host:
        out.extend(win.launched.get(h, ()))
    return out + list(win.orphans)


def _stream_waits(nodes: list[Node], win: Window, flows: dict, records: dict, edges: list) -> None:
    """cudaStreamWaitEvent: the waiting stream's wait node depends on the last work on the
    recorded stream launched before the cudaEventRecord."""
    for d, (track, corr) in win.pending_waits.items():
        rec = records.get((win.rank, corr))
        limit = nodes[rec].start_ns if rec is not None else nodes[d].start_ns
        before = [x for h in win.host if nodes[h].start_ns <= limit
                  for x in win.launched.get(h, ()) if nodes[x].track == track]  # fmt: skip
        if before:
            edges.append(Edge(before[-1], d, "stream_wait"))
            win.stream_waits[d] = before[-1]


def collective_peers(graph: Graph) -> dict[tuple, list[int]]:
    """Each collective (by its key) -> its node on every rank."""
    out: dict[tuple, list[int]] = defaultdict(list)
    for n in graph.nodes:
        if n.collective_key is not None:
            out[n.collective_key].append(n.index)
    return out

"""The chunked import's first pass: the trace read forward once to find where it splits into
chunks that the in-memory mapping can take one at a time.

A chunk is a stretch of time that no lane's nesting crosses: each lane's host rows (spans and
instants; a lane of a single row nests nothing and counts only where it starts) and each
forward -> backward flow's span (its ops must meet in one chunk) are merged into disjoint
components, and a chunk is a run of whole components. Host nesting, steps (ProfilerStep spans
are rows of the busiest lane), python stacks and fwdbwd flows then never reach across two
chunks. Device work follows
the runtime call that launched it (a correlation id -> chunk table), so a kernel that runs after
its chunk's host work still meets its launch; device work with no launch goes by its own time.
What stays in memory is a component per gap in the host's work (merged pairwise past
MAX_COMPONENTS, which only removes cuts) and a correlation id per launch; of the events' ids
only a range's are kept (a trace's are mostly distinct), and the fwdbwd flows'. A span of the
file is read on its own (`plan_span`, kineto_plan_spans reading spans in parallel) and the
spans' findings, kept as values rather than the span's codes, are combined in the file's
order (`combine`): a python frame is placed by the first span whose python rows name it (the
trace's own first mention, unless an earlier span names it in another kind of event, which
only changes the stacks' numbering). As the events are read, two files are written: what the
second pass needs of each event to route it (ROUTE_KEY: its time, its correlation id if it is
device work, whether it is a memory sample or metadata), and each range's decoded columns
(kineto_pieces), which the second pass hands to the chunks and their mapping reads, so that no
event is decoded twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow.compute as pc

from ..errors import BadInputError
from . import kineto_pieces as pieces
from .kineto_decode import Factorizer
from .kineto_kinds import LANE_NAME_EVENTS, MEMORY_EVENT, K, Roles, roles
from .kineto_ranges import FileSource, Piece, RangeError, Span, decode_span, phases
from .kineto_stream import StreamSource, open_stream
from .progress import Share
from .pystacks import Frame, parse_frame

MAX_COMPONENTS = 1 << 20  # past this many, adjacent components are merged in pairs
FIRST = np.iinfo(np.int64).min
# an event's route: its time (FIRST if it has none), the correlation id of device work (else
# -1), and COUNTER or METADATA flags
ROUTE_KEY = np.dtype([("ts", "<i8"), ("corr", "<i8"), ("flag", "i1")])
COUNTER, METADATA = 1, 2
PER_RANGE = ("id",)  # the fields whose values are kept a range at a time (mostly distinct)


@dataclass(frozen=True)
class Plan:
    """Where each event of the trace goes: chunk k holds the times in [bounds[k], bounds[k+1])
    (trace ns, before the base time), device work its launch's chunk."""

    bounds: np.ndarray  # int64, bounds[0] = FIRST
    launch_corr: np.ndarray  # int64, sorted: the correlation ids of runtime rows
    launch_chunk: np.ndarray  # int32: the chunk of each
    samples_first: bool  # memory samples all in chunk 0: their running sums span the trace
    top: dict[str, Any]  # the top-level keys
    frame_codes: dict[Frame, int]  # a python frame -> its name's place in the trace's names
    events: int
    keys: tuple[Path, ...]  # each span's events' ROUTE_KEYs, in the trace's order
    records: tuple[Path, ...]  # each span's ranges' decoded events (kineto_pieces)
    span_events: tuple[int, ...]  # how many events each span has
    spans: tuple[tuple[int | None, int | None], ...]  # each span's cuts (None: file start, end)

    @property
    def chunks(self) -> int:
        return len(self.bounds)

    def chunk_of_time(self, ts: np.ndarray) -> np.ndarray:
        return (np.searchsorted(self.bounds, ts, side="right") - 1).astype(np.int32)

    def chunk_of_launch(self, corr: np.ndarray) -> np.ndarray:
        """The chunk of each correlation id's launch, -1 where no runtime row has it."""
        if not self.launch_corr.size:
            return np.full(corr.size, -1, np.int32)
        pos = np.clip(np.searchsorted(self.launch_corr, corr), 0, self.launch_corr.size - 1)
        return np.where(self.launch_corr[pos] == corr, self.launch_chunk[pos], -1)


class _Union:
    """Disjoint intervals [start, end] (touching ones merged) with a count of rows each."""

    def __init__(self) -> None:
        self.start = np.zeros(0, np.int64)
        self.end = np.zeros(0, np.int64)
        self.count = np.zeros(0, np.int64)

    def add(self, start: np.ndarray, end: np.ndarray, count: np.ndarray) -> None:
        s = np.concatenate([self.start, start])
        order = np.argsort(s, kind="stable")
        s, e = s[order], np.concatenate([self.end, end])[order]
        c = np.concatenate([self.count, count])[order]
        reach = np.maximum.accumulate(e)
        first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])
        self.start, self.end = s[first], np.maximum.reduceat(e, first) if s.size else e
        self.count = np.add.reduceat(c, first) if s.size else c
        while self.start.size > MAX_COMPONENTS:
            self.coarsen()

    def coarsen(self) -> None:
        first = np.arange(0, self.start.size, 2)
        self.start = self.start[first]
        self.end = np.maximum.reduceat(self.end, first)
        self.count = np.add.reduceat(self.count, first)


class _Pass:
    """What the first pass gathers from each range's columns of one span of the trace."""

    def __init__(self, span: Span, keys: BinaryIO) -> None:
        self.span, self.keys, self.events, self.host = span, keys, 0, 0
        self.lanes: dict[int, _Union] = {}  # by (pid code, tid code): nesting is per lane
        self.flow_id_codes = Factorizer()  # fwdbwd flows' ids (the span's ids are per range)
        self.flow_ids: list[np.ndarray] = []
        self.flow_ts: list[np.ndarray] = []
        self.corr: list[np.ndarray] = []
        self.corr_ts: list[np.ndarray] = []
        self.python: set[int] = set()
        self.running_sums = False
        self.named = 0  # the distinct names looked at so far (the span's list grows)
        self.memory_code = -2
        self.lane_codes: list[int] = []

    def roles(self, p: Piece) -> Roles:
        """A range's roles, as its decode found them; only the names new in this range are
        looked at (a trace can have a million distinct names)."""
        names = self.span.values["name"]
        for code in range(self.named, len(names)):
            if names[code] == MEMORY_EVENT:
                self.memory_code = code
            elif names[code] in LANE_NAME_EVENTS:
                self.lane_codes.append(code)
        self.named = len(names)
        ph = phases(self.span.values["ph"], p.codes["ph"])
        memory = p.codes["name"] == self.memory_code
        lane = np.isin(p.codes["name"], self.lane_codes)
        return roles(ph, p.codes["cat"], self.span.values["cat"], memory, lane)

    def piece(self, p: Piece) -> None:
        r = self.roles(p)
        ts, ok = p.ts.ns, ~(p.ts.missing | p.ts.out_of_range)
        self.events += ts.size
        host = np.flatnonzero(r.is_row & ~r.device & ok)
        self.host += host.size
        end = ts[host] + np.where(p.dur.missing[host], 0, np.maximum(p.dur.ns[host], 0))
        lane = p.codes["pid"][host] * (1 << 32) + p.codes["tid"][host]
        for key in np.unique(lane).tolist():
            mine = lane == key
            u = self.lanes.setdefault(key, _Union())
            u.add(ts[host][mine], end[mine], np.ones(int(mine.sum()), np.int64))
        cats = self.span.values["cat"]
        fwdbwd = np.array([c.lower() == "fwdbwd" for c in cats] or [False])[p.codes["cat"]]
        flows = np.flatnonzero(r.is_flow & fwdbwd & ok & (p.codes["id"] >= 0))
        ids = self.span.values["id"]
        self.flow_ids.append(self.flow_id_codes.codes([ids[c] for c in p.codes["id"][flows]]))
        self.flow_ts.append(ts[flows])
        gpu = np.flatnonzero(r.typed_subsets()["gpu"])
        corr = pc.fill_null(p.typed["gpu"][0], -1).to_numpy(zero_copy_only=False)
        launch = (r.kind[gpu] == K["runtime"]) & ~r.device[gpu] & (corr >= 0) & ok[gpu]
        self.corr.append(corr[launch])
        self.corr_ts.append(ts[gpu[launch]])
        self.python.update(np.unique(p.codes["name"][r.is_row & (r.kind == K["python"])]).tolist())
        alloc, nbytes = p.typed["mem"][0], p.typed["mem"][4]
        self.running_sums |= bool(pc.any(pc.and_(pc.is_null(alloc), pc.is_valid(nbytes))).as_py())
        self.route_keys(p, r, ok, corr, gpu)

    def route_keys(
        self, p: Piece, r: Roles, ok: np.ndarray, corr: np.ndarray, gpu: np.ndarray
    ) -> None:
        keys = np.zeros(ok.size, ROUTE_KEY)
        keys["ts"] = np.where(ok, p.ts.ns, FIRST)
        keys["corr"] = -1
        dev = r.device[gpu]
        keys["corr"][gpu[dev]] = corr[dev]
        keys["flag"][r.is_counter] = COUNTER
        ph = self.span.values["ph"]
        keys["flag"][p.codes["ph"] == (ph.index("M") if "M" in ph else -2)] = METADATA
        keys.tofile(self.keys)

    def finish(self, keys: Path, records: Path) -> SpanPlan:
        """What the span gives the plan, its codes made values (spans number theirs apart)."""
        pids, tids, names = (
            self.span.values["pid"],
            self.span.values["tid"],
            self.span.values["name"],
        )
        lanes = {}
        for key, u in self.lanes.items():
            tid = ((key + 1) & 0xFFFFFFFF) - 1  # the key packs tid, -1 for none, in 32 bits
            pid = (key - tid) >> 32
            lanes[(None if pid < 0 else pids[pid], None if tid < 0 else tids[tid])] = u
        return SpanPlan(
            self.events,
            self.host,
            lanes,
            list(self.flow_id_codes.seen),
            _concat(self.flow_ids),
            _concat(self.flow_ts),
            _concat(self.corr),
            _concat(self.corr_ts),
            [names[c] for c in sorted(self.python)],
            self.running_sums,
            dict(self.span.top),
            keys,
            records,
        )


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


@dataclass
class SpanPlan:
    """What the first pass found in one span of the trace (bytes between two event boundaries),
    as values the spans share: combine() makes the trace's Plan of the spans' in order."""

    events: int
    host: int
    lanes: dict[tuple[Any, Any], _Union]  # (pid, tid) -> the lane's host rows
    flow_values: list[Any]  # the fwdbwd flows' distinct ids
    flow_codes: np.ndarray  # each fwdbwd flow's id, a code into flow_values
    flow_ts: np.ndarray
    corr: np.ndarray  # runtime launches' correlation ids, in the span's order
    corr_ts: np.ndarray
    python: list[str]  # python rows' distinct names, in the order the span first has them
    running_sums: bool
    top: dict[str, Any]
    keys: Path  # the span's events' ROUTE_KEYs
    records: Path  # its ranges' decoded events (kineto_pieces), for the mapping


def plan_span(
    path: Path,
    begin: int | None,
    end: int | None,
    range_bytes: int,
    keys: Path,
    progress: Share,
) -> SpanPlan:
    """Read the events between cuts `begin` and `end` (None: the file's start, its end) once;
    RangeError if a range does not decode."""
    f, gz = open_stream(path)
    span = Span()
    total = max(1, path.stat().st_size)
    whole = begin is None and end is None
    records = keys.with_name(keys.name.replace("route-keys", "records"))
    with f, keys.open("wb") as keys_file, records.open("wb") as records_file:
        gather = _Pass(span, keys_file)
        # a span of a plain file is read where it lies; the whole file (or gzip) as a stream
        source = StreamSource(f, path, gzip=gz) if whole else FileSource(f.fileno(), total)
        done = [0.0]

        def keep(p: Piece) -> None:
            gather.piece(p)
            if p.ts.ns.size:  # the range decoded whole, kept for the mapping
                records_file.write(pieces.dump(pieces.record_of(p, span.values, PER_RANGE)))
            read = source.bytes_read / total if isinstance(source, StreamSource) else done[0]
            progress(min(1.0, read), gather.events)

        decode_span(source, begin, end, keep=keep, range_bytes=range_bytes, path=path,
                    span=span, per_range=PER_RANGE,
                    progress=lambda share: done.__setitem__(0, share))  # fmt: skip
    return gather.finish(keys, records)


def plan(path: Path, chunk_events: int, range_bytes: int, progress: Share, folder: Path) -> Plan:
    """Read the trace once and cut it into chunks of about `chunk_events` events each (the
    events' route keys and decoded columns written under `folder`)."""
    try:
        part = plan_span(path, None, None, range_bytes, folder / "route-keys-0", progress)
    except RangeError as e:
        raise BadInputError(path, f"invalid JSON or not a torch.profiler trace ({e})") from None
    return combine([part], [(None, None)], chunk_events)


def combine(
    parts: list[SpanPlan], spans: list[tuple[int | None, int | None]], chunk_events: int
) -> Plan:
    """The trace's plan from its spans' (in the file's order): lanes and flows joined across
    spans, launches in the trace's order, python frames by where the trace first names them."""
    lanes: dict[tuple[Any, Any], _Union] = {}
    flow_id_codes = Factorizer()
    flow_ids, flow_ts = [], []
    frame_codes: dict[Frame, int] = {}
    top: dict[str, Any] = {}
    for k, part in enumerate(parts):
        for key, u in part.lanes.items():
            lanes.setdefault(key, _Union()).add(u.start, u.end, u.count)
        flow_ids.append(flow_id_codes.remap(part.flow_values)[part.flow_codes])
        flow_ts.append(part.flow_ts)
        for code, name in enumerate(part.python):  # a later span's names come after
            frame_codes.setdefault(parse_frame(name), (k << 40) + code)
        top.update(part.top)
    u = _flows(np.concatenate(flow_ids), np.concatenate(flow_ts))
    for lane in lanes.values():
        # a lane with one row nests nothing (torch's "PyTorch Profiler" span over the whole
        # trace, on a lane of its own): its row only counts
        u.add(lane.start, lane.start if lane.count.sum() <= 1 else lane.end, lane.count)
    events, host = sum(p.events for p in parts), sum(p.host for p in parts)
    cuts = _cuts(u, events / max(1, host), chunk_events)
    corr = np.concatenate([p.corr for p in parts])
    ts = np.concatenate([p.corr_ts for p in parts])
    order = np.argsort(corr, kind="stable")  # the first launch of an id, as the mapping's
    corr, ts = corr[order], ts[order]
    first = np.r_[True, corr[1:] != corr[:-1]] if corr.size else np.zeros(0, bool)
    chunk = (np.searchsorted(cuts, ts[first], side="right") - 1).astype(np.int32)
    running_sums = any(p.running_sums for p in parts)
    return Plan(cuts, corr[first], chunk, running_sums, top, frame_codes, events,
                tuple(p.keys for p in parts), tuple(p.records for p in parts),
                tuple(p.events for p in parts), tuple(spans))  # fmt: skip


def _flows(ids: np.ndarray, ts: np.ndarray) -> _Union:
    """Each fwdbwd flow's span as an interval: its ends land in one chunk."""
    u = _Union()
    if not ids.size:
        return u
    order = np.lexsort((ts, ids))
    ids, ts = ids[order], ts[order]
    first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    last = np.r_[first[1:], ids.size] - 1
    u.add(ts[first], ts[last], np.zeros(first.size, np.int64))
    return u


def _cuts(u: _Union, scale: float, chunk_events: int) -> np.ndarray:
    """Bounds between components, about `chunk_events` events apart (every event counted
    where the host rows are: `scale` events a host row)."""
    bounds = [FIRST]
    held = 0.0
    for start, count in zip(u.start.tolist(), u.count.tolist(), strict=True):
        if held and held + count * scale > chunk_events:
            bounds.append(start)
            held = 0.0
        held += count * scale
    return np.array(bounds, np.int64)

"""The chunked import: a trace whose mapping would not fit the memory budget, imported a chunk
at a time by the in-memory mapping (kineto.load), into the same profile.

Three passes: kineto_plan decodes the trace once, finds the chunks (stretches of time no lane's
nesting crosses, device work with its launch) and writes each event's route and each range's
decoded columns, kineto_route hands each range's columns to its chunk's file by the routes
(kineto_pieces), both over spans of a big plain file in parallel (kineto_plan_spans), and each
chunk's columns are mapped, its rows written as a sorted run, its counters to a file, and let
go (kineto_chunk_map: in a worker process per CPU for a big trace, each chunk sized to one
worker's share of the budget); kineto_merge merges the runs in
the events table's order, and the chunks' stacks are numbered as one trace's
(`global_stacks`). Steps, a few per step, stay in memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..model.io import ProfileWriter
from ..model.manifest import Manifest, Step
from ..model.schema import COUNTERS, STACKS, conform
from . import kineto
from .assemble import Assembled, assign_ranks, write_assembled
from .kineto_chunk_map import Mapped, map_chunks, pool_workers
from .kineto_columns import give_back_free_memory, range_bytes_for
from .kineto_extract import DecodeOptions, default_workers
from .kineto_heap import freed_blocks_kept
from .kineto_memory import NAMES
from .kineto_merge import Run, global_ids, merged_blocks
from .kineto_plan_spans import plan_spans, route_spans
from .kineto_route import chunk_folder
from .kineto_stream import open_stream
from .progress import Share, no_share
from .pystacks import Frame, scope_of

# bytes a trace's event takes in the in-memory mapping (decoded 62, mapped 65: benchmarks/README)
MAPPING_BYTES_PER_EVENT = 160
MAPPING_BYTES_PER_TEXT_BYTE = 0.6  # the 1 GB benchmark trace's peak over its size
MIN_CHUNKED_TEXT = 64 << 20  # below this the interpreter's own 80 MB is most of the peak
# the first pass's ranges (at most the budget over 64), each decoded once, its columns a record
# on disk routed whole to a chunk: the pass keeps nothing of a range's events in memory and a
# chunk's mapping is sized by the budget, so larger ranges cost little memory, and per-range
# costs fall (100 MB trace: 2.2 and 2.6 s of CPU for the two passes in 56 KB ranges, 1.0 and
# 1.3 s in 1 MB ones; 300 MB: 2 MB ranges 10% less than 8 MB ones, 8% less than 1 MB ones)
PASS_RANGE_BYTES = 2 << 20
# a chunk's events at most, whatever the budget: a chunk's temporaries are fresh pages the kernel
# clears (a mapping of their own past kineto_heap's 4 MB), so larger chunks cost system time
# and memory, not less work (the 1 GB trace mapped in chunks of 6.7 M events: 0.80 M page
# faults; of 1.7 M: 0.33 M, and 10% less user time; benchmarks/README.md, "Seventh round")
MAX_CHUNK_EVENTS = 2 << 20
PLAN_SHARE = 0.3  # of the progress: the first pass (the file read; then routed, mapped, merged)


def chunked(path: Path, options: DecodeOptions) -> bool:
    """Whether `path` is imported in chunks: its mapping's estimated memory is over the budget
    (a trace under MIN_CHUNKED_TEXT never is, unless a chunk budget is given)."""
    budget = options.chunk_budget or options.memory_budget
    if budget is None:
        return False
    f, gz = open_stream(path)
    f.close()
    text = path.stat().st_size * (10 if gz else 1)
    big = text >= MIN_CHUNKED_TEXT or options.chunk_budget is not None
    return big and text * MAPPING_BYTES_PER_TEXT_BYTE > budget


@dataclass
class _Gathered:
    """What is kept of each chunk once its rows are in a run."""

    runs: list[Run] = field(default_factory=list)
    stacks: list[dict[str, pa.Array]] = field(default_factory=list)
    counters: list[Path] = field(default_factory=list)  # each chunk's, on disk
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    user_files: set[str] = field(default_factory=set)
    origin: int | None = None
    head: kineto.FileData | None = None

    def add(self, chunk: Mapped) -> None:
        self.runs.append(chunk.run)
        self.stacks.append(chunk.stacks)
        self.counters.append(chunk.counters)
        self.steps += chunk.steps
        self.user_files |= chunk.user_files
        self.origin = chunk.start_ns if self.origin is None else min(self.origin, chunk.start_ns)
        self.head = self.head or chunk.head


def write_chunked(
    path: Path,
    writer: ProfileWriter,
    options: DecodeOptions,
    *,
    thread_names: bool = True,
    source_roots: Sequence[Path] = (),
    progress: Share = no_share,
) -> Path:
    """Import one trace file in chunks and write its profile with `writer`."""
    budget = options.chunk_budget or options.memory_budget
    assert budget is not None
    memory = options.memory_budget or budget
    range_bytes = max(range_bytes_for(memory), min(PASS_RANGE_BYTES, memory // 64))
    workers = pool_workers(path, options.workers or default_workers())
    # each worker's share of the budget
    chunk_events = max(1, min(MAX_CHUNK_EVENTS, budget // workers // MAPPING_BYTES_PER_EVENT))
    with freed_blocks_kept(), chunk_folder() as folder:
        the_plan = plan_spans(path, chunk_events, range_bytes,
                              lambda f, n=None: progress(PLAN_SHARE * f, n), Path(folder),
                              options.workers or default_workers())  # fmt: skip
        # pass 1 decoded every event (its workers' counts do not come back): the total, from here
        events = the_plan.events
        progress(PLAN_SHARE, events)
        chunks = route_spans(path, the_plan, Path(folder),
                             lambda f, n=None: progress(PLAN_SHARE + 0.2 * f, events))  # fmt: skip
        # the route keys are used; the records stay: the chunks read most of them where they are
        for used in the_plan.keys:
            used.unlink(missing_ok=True)
        # the passes' freed ranges back to the OS before the mapping's workers fork from here
        give_back_free_memory()
        chunk_options = replace(options, chunk_budget=None)
        got = _Gathered()
        mapping = map_chunks(path, chunks, the_plan.top, chunk_options, thread_names, workers)
        for k, mapped in enumerate(mapping):
            got.add(mapped)
            progress(0.5 + 0.3 * (k + 1) / len(chunks), events)
        assert got.head is not None and got.origin is not None
        stacks, maps = global_stacks(got.stacks, the_plan.frame_codes)
        ids = global_ids(got.runs)
        (rank,) = assign_ranks([got.head])
        assembled = Assembled(
            merged_blocks(got.runs, ids, maps, rank, got.origin),
            conform(STACKS, stacks),
            COUNTERS.arrow_schema().empty_table(),
            _manifest(got, rank),
        )
        files = [replace(got.head, user_files=got.user_files)]
        return write_assembled(assembled, files, writer=writer, source_roots=source_roots,
                               progress=lambda f: progress(0.8 + 0.2 * f, events),
                               counter_parts=_counters(got.counters, rank, got.origin),
                               overlap=True)  # fmt: skip


def global_stacks(
    tables: list[dict[str, pa.Array]], frame_codes: dict[Frame, int]
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The chunks' stacks as one trace's stacks table (numbered as pystacks.build numbers
    them: by depth from the outermost frame, then by caller and frame name), and each chunk's
    stack ids in that numbering."""
    chains = [_chains(t) for t in tables]
    every = {c for chunk in chains for c in chunk}
    number: dict[tuple[Frame, ...], int] = {}
    for level in range(max((len(c) for c in every), default=0)):
        here = [c for c in every if len(c) == level + 1]
        here.sort(key=lambda c: (number[c[:-1]] if level else -1, frame_codes.get(c[-1], 1 << 62)))
        for c in here:
            number[c] = len(number)
    rows: dict[str, list] = {
        k: [] for k in ("stack_id", "depth", "file", "line", "function", "scope")
    }
    for c, sid in number.items():
        for depth, frame in enumerate(reversed(c)):
            rows["stack_id"].append(sid)
            rows["depth"].append(depth)
            rows["file"].append(frame.file)
            rows["line"].append(frame.line)
            rows["function"].append(frame.func)
            rows["scope"].append(scope_of(frame.file, frame.func))
    maps = [np.array([number[c] for c in chunk], np.int64) for chunk in chains]
    return rows, maps


def _chains(table: dict[str, pa.Array]) -> list[tuple[Frame, ...]]:
    """Each local stack's frames, outermost first (rows are (stack, depth) in order)."""
    sid = table["stack_id"].to_pylist()
    frames = zip(table["file"].to_pylist(), table["line"].to_pylist(),
                 table["function"].to_pylist(), strict=True)  # fmt: skip
    out: list[list[Frame]] = []
    for s, (file, line, func) in zip(sid, frames, strict=True):
        if s == len(out):
            out.append([])
        out[s].append(Frame(file, line, func))
    return [tuple(reversed(c)) for c in out]


def _counters(parts: list[Path], rank: int, origin: int) -> Iterator[pa.Table]:
    """The chunks' counters, read back a chunk at a time, on the profile's origin, in the
    in-memory import's order: every chunk's memory_allocated samples, then memory_reserved."""
    for name in NAMES.to_pylist():
        for path in parts:
            c = pq.read_table(path)
            c = c.filter(pc.equal(c.column("name").cast(pa.string()), name))
            n = c.num_rows
            ts = pc.subtract(c.column("ts_ns"), origin)
            c = c.set_column(c.schema.get_field_index("ts_ns"), "ts_ns", ts)
            c = c.append_column("rank", pa.array(np.full(n, rank, dtype=np.int32)))
            yield c.append_column("unit", pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(n, np.int32)), pa.array(["bytes"], pa.string())))  # fmt: skip


def _manifest(got: _Gathered, rank: int) -> Manifest:
    head, origin = got.head, got.origin
    assert head is not None and origin is not None
    steps = [Step(s, rank, start - origin, dur) for s, start, dur in got.steps]
    return Manifest(
        source="kineto",
        origin_unix_ns=origin,
        ranks=(rank,),
        devices=tuple(head.devices),
        host=str(head.meta.get("host_name", "")),
        steps=tuple(sorted(steps, key=lambda s: (s.rank, s.step, s.start_ns))),
        inputs=(str(head.path),),
        extra={"kineto": [{"rank": rank, "path": str(head.path), **head.meta}]},
    )

"""The chunked import's chunks mapped, each by the in-memory mapping (kineto.load) of its
columns, which the first pass decoded (kineto_pieces), into a sorted run: in this process, or,
for a big trace on a machine of several CPUs, in worker processes that take the chunks in turn
(the memory budget is split among them: kineto_chunked sizes the chunks by it). A worker hands
back only what the merge keeps of a chunk (`Mapped`): its rows and counters are on disk.
"""

from __future__ import annotations

import multiprocessing
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import BadInputError
from . import kineto
from . import kineto_pieces as pieces
from .kineto_extract import DecodeOptions
from .kineto_merge import Run, write_run
from .kineto_route import Chunk

POOL_MIN_BYTES = 256 << 20  # below this, mapping in one process is quick enough
EVENT_NUMBER = re.compile(r"event #(\d+)")  # a mapping error's event, numbered in its chunk


@dataclass(frozen=True)
class Mapped:
    """What is kept of a chunk once its rows are a run and its counters a file."""

    run: Run
    stacks: dict[str, pa.Array]
    counters: Path
    steps: list[tuple[int, int, int]]
    user_files: set[str]
    start_ns: int
    head: kineto.FileData  # the chunk's trace-wide facts (meta, devices), no rows


@dataclass(frozen=True)
class _Job:
    trace: Path
    chunk: Chunk
    top: dict[str, Any]  # the trace's top-level keys
    options: DecodeOptions
    thread_names: bool


def pool_workers(path: Path, workers: int) -> int:
    """How many processes map the chunks of `path`: `workers` for a big trace, else 1."""
    return workers if workers > 1 and path.stat().st_size >= POOL_MIN_BYTES else 1


def map_chunks(
    trace: Path,
    chunks: Sequence[Chunk],
    top: dict[str, Any],
    options: DecodeOptions,
    thread_names: bool,
    workers: int,
) -> Iterator[Mapped]:
    """Each chunk mapped, in the chunks' order (BadInputError naming `trace`; `top`: its
    top-level keys)."""
    jobs = [_Job(trace, c, top, options, thread_names) for c in chunks]
    if workers <= 1 or len(jobs) <= 1:
        yield from map(_map_or_raise, jobs)
        return
    # forked, not spawned: a spawned worker imports the caller's main module, which a script
    # without a main guard cannot take (kineto_parallel forks its decoders likewise)
    context = multiprocessing.get_context("fork")
    with context.Pool(min(workers, len(jobs))) as pool:
        for got in pool.imap(map_chunk, jobs):
            if isinstance(got, str):
                raise BadInputError(trace, got)
            yield got


def _map_or_raise(job: _Job) -> Mapped:
    got = map_chunk(job)
    if isinstance(got, str):
        raise BadInputError(job.trace, got)
    return got


def map_chunk(job: _Job) -> Mapped | str:
    """One chunk mapped and written as a run, or the problem with it (its events numbered as
    the trace's)."""
    chunk = job.chunk
    try:
        decoded = pieces.decoded(chunk.records, job.top)
        f = kineto.load(chunk.path, None, job.options, thread_names=job.thread_names,
                        event_index=True, decoded=decoded)  # fmt: skip
        del decoded
    except BadInputError as e:
        index = chunk.event_index()
        return EVENT_NUMBER.sub(lambda m: f"event #{index[int(m[1])]}", e.problem)
    run = write_run(f, chunk.event_index(), chunk.path.with_suffix(".run"))
    chunk.remove()
    counters = chunk.path.with_suffix(".counters.parquet")
    pq.write_table(pa.table(f.counters), counters)
    head = replace(f, path=job.trace, columns={}, links={}, stacks={}, counters={},
                   event_index=None)  # fmt: skip
    start = int(f.columns["start_ns"].min())
    return Mapped(run, f.stacks, counters, f.steps, f.user_files, start, head)

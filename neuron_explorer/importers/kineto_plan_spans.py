"""The chunked import's first two passes in parallel: a big plain trace is cut into one span per
worker at event boundaries (as kineto_parallel cuts it), this process reads the first span
while forked workers read the others, and each span is planned (kineto_plan.plan_span, the
plans then combined in the file's order) and routed (kineto_route.route_span, each span
writing its part of every chunk's file, the parts joined) on its own.

A span that does not decode (a cut that was not between two events, or a bad file) makes the
pass run over the whole file in this process, which gives the usual one-line error for a bad
file and the same plan otherwise.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import BadInputError
from . import kineto_parallel as parallel
from .kineto_plan import Plan, SpanPlan, combine, plan, plan_span
from .kineto_ranges import FileSource, RangeError
from .kineto_route import Chunk, ChunkWriters, Routed, chunks_of, join_parts, route, route_span
from .kineto_stream import open_stream
from .progress import Share

MIN_SPAN_BYTES = 32 << 20  # below this a span's worker costs more than it saves
T = TypeVar("T")

# what the forked workers read: set before the pool forks them (a plan can hold tens of MB of
# launches, which pickling into every job would copy)
_JOB: dict[str, Any] = {}


def spans_of(path: Path, workers: int) -> list[tuple[int | None, int | None]]:
    """The file's spans, one per worker at most, of about equal size, each at least
    MIN_SPAN_BYTES; a gzip file, or one too small, is one span (None, None)."""
    f, gz = open_stream(path)
    with f:
        size = path.stat().st_size
        parts = min(workers, size // max(1, MIN_SPAN_BYTES))
        if gz or parts <= 1 or not parallel.available():
            return [(None, None)]
        # equal spans: this process only waits for the workers' (the PARENT_SHARE of
        # kineto_parallel is for a parent that also reads its children's columns back)
        cut_at = parallel.cuts(FileSource(f.fileno(), size), parts, parent_share=1.0)
    if not cut_at:
        return [(None, None)]
    return list(zip([None, *cut_at], [*cut_at, None], strict=True))


def plan_spans(
    path: Path, chunk_events: int, range_bytes: int, progress: Share, folder: Path, workers: int
) -> Plan:
    """kineto_plan.plan, the spans of `path` read in parallel."""
    spans = spans_of(path, workers)
    if len(spans) > 1:
        _JOB.update(path=path, spans=spans, range_bytes=range_bytes, folder=folder)
        try:
            parts = _here_and_forked(_plan_one, len(spans), progress)
            return combine(parts, spans, chunk_events)
        except RangeError:
            pass  # the whole file in this process: its error, or its plan
        finally:
            _JOB.clear()
    return plan(path, chunk_events, range_bytes, progress, folder)


def route_spans(path: Path, the_plan: Plan, folder: Path, progress: Share) -> list[Chunk]:
    """kineto_route.route, the plan's spans routed in parallel, each into parts of the chunks'
    files, then joined."""
    if len(the_plan.spans) <= 1:
        return route(path, the_plan, folder, progress)
    chunks = chunks_of(the_plan, folder)
    _JOB.update(path=path, plan=the_plan, chunks=chunks)
    try:
        routed = _here_and_forked(_route_one, len(the_plan.spans), progress)
    except RangeError:  # no worker could start: the whole file here
        return route(path, the_plan, folder, progress)
    finally:
        _JOB.clear()
    return join_parts(chunks, routed)


def _plan_one(span: int, progress: Share) -> SpanPlan:
    begin, end = _JOB["spans"][span]
    keys = _JOB["folder"] / f"route-keys-{span}"
    return plan_span(_JOB["path"], begin, end, _JOB["range_bytes"], keys, progress)


def _route_one(span: int, progress: Share) -> Routed:
    writers = ChunkWriters(_JOB["chunks"], suffix=f".part{span}")
    try:
        route_span(_JOB["path"], _JOB["plan"], span, span + 1, writers, progress)
    finally:
        started = writers.close()
    return started


def _here_and_forked(work: Callable[[int, Share], T], spans: int, progress: Share) -> list[T]:
    """`work` on span 0 here (its progress reported) and on the others in forked workers; a
    worker's BadInputError is raised here as one."""
    context = multiprocessing.get_context("fork")  # see kineto_chunk_map: no spawn
    try:
        with warnings.catch_warnings():  # Python 3.12+ warns of fork in a threaded process
            warnings.simplefilter("ignore", DeprecationWarning)
            pool = context.Pool(spans - 1)
    except OSError as e:  # out of processes or memory: the caller reads the file here
        raise RangeError(f"cannot start a worker process ({e})") from None
    with pool:
        later = pool.map_async(_in_worker, [(work, k) for k in range(1, spans)])
        first = work(0, lambda f, n=None: progress(f, None))
        got: Sequence[T | str] = later.get()
    for g in got:
        if isinstance(g, str):
            raise BadInputError(_JOB["path"], g)
    return [first, *got]  # type: ignore[list-item]


def _in_worker(job: tuple[Callable[[int, Share], T], int]) -> T | str:
    work, span = job
    try:
        return work(span, lambda f, n=None: None)
    except BadInputError as e:  # its path does not pickle back: the problem does
        return e.problem

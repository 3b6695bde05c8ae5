"""The SQL box: one read-only SELECT over the profile's tables through neuron_explorer.analysis's
run_query (Arrow datasets registered, then external access off and the configuration locked),
with the web page's row and time limits and example queries."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from neuron_explorer.analysis.sql import QueryResult
from neuron_explorer.analysis.sql_process import QueryProcess
from neuron_explorer.errors import ExplorerError
from neuron_explorer.model import Profile

MAX_ROWS = 10_000
DEFAULT_ROWS = 1_000
TIMEOUT_S = 10.0
MAX_SQL_CHARS = 10_000  # the SQL box's text arrives in the URL; no real query needs more
# Limits for the whole server, not one query: at most RUNNING queries at once (one per core of a
# laptop), QUEUED more waiting, and the others refused at once (503) instead of piling up; each
# query may hold QUERY_MEMORY, so all SQL together stays under RUNNING x QUERY_MEMORY (1.5 GB),
# and an answer carries at most MAX_RESULT_BYTES of rows (Arrow size; JSON is about as large).
RUNNING = 2
QUEUED = 6
QUERY_MEMORY = "768MB"
MAX_RESULT_BYTES = 16 << 20
# the most resident memory a query's process may hold (its own ~150 MB, DuckDB's QUERY_MEMORY,
# the answer): one that builds a value outside DuckDB's limit is killed here (sql_process.py)
QUERY_RSS = 1 << 30
_WORKERS = threading.local()  # each SQL thread's query process
T = TypeVar("T")

EXAMPLES = (
    ("Slowest ops", "SELECT name, count(*) AS n, sum(dur_ns) / 1e6 AS total_ms\nFROM events "
     "WHERE kind = 'op'\nGROUP BY name ORDER BY total_ms DESC LIMIT 20"),
    ("Device time by kind", "SELECT kind, track, count(*) AS n, sum(dur_ns) / 1e6 AS total_ms\n"
     "FROM events WHERE layer = 'device'\nGROUP BY ALL ORDER BY total_ms DESC"),
    ("Hottest source lines", "SELECT src_file, src_line, sum(dur_ns) / 1e6 AS total_ms\n"
     "FROM events WHERE src_file IS NOT NULL AND kind = 'op'\nGROUP BY ALL "
     "ORDER BY total_ms DESC LIMIT 20"),
    ("Step times", "SELECT step, min(start_ns) AS start_ns, max(dur_ns) / 1e6 AS ms\n"
     "FROM events WHERE kind = 'step'\nGROUP BY step ORDER BY step"),
)  # fmt: skip


class QueryError(ExplorerError):
    """The query was refused, failed, or ran past its time limit."""


class Busy(ExplorerError):
    """Every SQL slot of the server is taken; the client should try again (503)."""


class QueryGate:
    """The server's SQL runs on its own RUNNING threads, never on the threads that serve pages
    and static files, so a flood of queries queues (at most QUEUED) or is refused, and every
    other route stays as fast as before."""

    def __init__(self, running: int = RUNNING, queued: int = QUEUED) -> None:
        self._pool = ThreadPoolExecutor(max_workers=running, thread_name_prefix="sql")
        self._capacity = running + queued
        self._admitted = 0
        self._lock = threading.Lock()

    @property
    def admitted(self) -> int:
        """Queries running or waiting now."""
        return self._admitted

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on a SQL thread; Busy when RUNNING + QUEUED queries are already admitted."""
        with self._lock:
            if self._admitted >= self._capacity:
                raise Busy(f"query: the server is running {self._admitted} queries already; "
                           "try again in a few seconds")  # fmt: skip
            self._admitted += 1
        future = self._pool.submit(fn)
        future.add_done_callback(self._release)
        return future

    def _release(self, _: Future) -> None:
        with self._lock:
            self._admitted -= 1


def run_query(
    profile: Profile, sql: str, limit: int = DEFAULT_ROWS, timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    """The query's QueryResult.to_dict(), the document `query --json` prints."""
    return query(profile, sql, limit, timeout_s).to_dict()


def query(
    profile: Profile, sql: str, limit: int = DEFAULT_ROWS, timeout_s: float = TIMEOUT_S
) -> QueryResult:
    """neuron_explorer.analysis.run_query (read only, limited) with the web's limits, in this
    SQL thread's query process (analysis/sql_process.py: resident memory at most QUERY_RSS)."""

    if not sql.strip():
        raise QueryError("query: empty")
    if len(sql) > MAX_SQL_CHARS:
        raise QueryError(f"query: longer than the limit of {MAX_SQL_CHARS} characters")
    limit = max(1, min(int(limit), MAX_ROWS))
    worker = _WORKERS.__dict__.setdefault("process", QueryProcess())
    try:  # bounded from outside: DuckDB's own limit misses some values it builds
        return worker.run(profile, sql, rss_limit=QUERY_RSS, limit=limit, timeout_s=timeout_s,
                          memory_limit=QUERY_MEMORY, max_bytes=MAX_RESULT_BYTES)  # fmt: skip
    except ExplorerError as e:
        raise QueryError(str(e)) from None

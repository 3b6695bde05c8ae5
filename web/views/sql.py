"""The SQL box: one read-only SELECT over the profile's tables, with a row limit and a time limit.

The connection registers the tables as Arrow datasets and then turns external access off and
locks the configuration, so a query can read no other file, write none and attach nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from explorer.errors import ExplorerError
from explorer.model import Profile

MAX_ROWS = 10_000
DEFAULT_ROWS = 1_000
TIMEOUT_S = 10.0

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


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool
    elapsed_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"columns": self.columns, "rows": self.rows, "truncated": self.truncated,
                "elapsed_ms": round(self.elapsed_ms, 2), "row_count": len(self.rows)}  # fmt: skip


def read_only_connection(profile: Profile):  # noqa: ANN201 - a DuckDB connection
    import duckdb

    con = duckdb.connect(config={"threads": 1})
    for name in ("events", "stacks", "counters"):
        con.register(name, profile.dataset(name))
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def run_query(
    profile: Profile, sql: str, limit: int = DEFAULT_ROWS, timeout_s: float = TIMEOUT_S
) -> QueryResult:
    """Run one SELECT (or WITH ... SELECT); at most `limit` rows, at most `timeout_s` seconds."""
    import duckdb

    body = sql.strip().rstrip(";").strip()
    if not body:
        raise QueryError("empty query")
    limit = max(1, min(int(limit), MAX_ROWS))
    con = read_only_connection(profile)
    timer = threading.Timer(timeout_s, con.interrupt)
    t0 = time.perf_counter()
    timer.start()
    try:
        # as a subquery, only a single read-only statement parses
        rel = con.execute(f"SELECT * FROM ({body}\n) AS q LIMIT {limit + 1}")
        columns = [d[0] for d in rel.description]
        rows = [[_jsonable(v) for v in r] for r in rel.fetchall()]
    except duckdb.InterruptException:
        raise QueryError(f"query ran longer than its {timeout_s:g} s limit") from None
    except duckdb.Error as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        raise QueryError(msg) from None
    finally:
        timer.cancel()
        con.close()
    elapsed = (time.perf_counter() - t0) * 1e3
    return QueryResult(columns, rows[:limit], len(rows) > limit, elapsed)

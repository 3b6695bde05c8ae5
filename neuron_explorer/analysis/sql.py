"""Read-only SQL over a profile, with a row limit and a time limit. The CLI's `query` command
and the web UI's SQL page both run queries through `run_query`."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..errors import ExplorerError
from ..model.profile import Profile
from ..model.schema import TABLES

DEFAULT_LIMIT = 1000
DEFAULT_TIMEOUT_S = 30.0
MEMORY_LIMIT = "2GB"  # a runaway query fails instead of exhausting the machine
QUERY_THREADS = 1  # a runaway query holds one core until its time limit, not all of them
BATCH_ROWS = 2048


@dataclass(frozen=True)
class QueryResult:
    """The rows of a query (at most `limit`), and whether more rows were cut off."""

    table: pa.Table
    truncated: bool
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": self.table.column_names,
            "types": [str(t) for t in self.table.schema.types],
            "rows": self.table.to_pylist(),
            "truncated": self.truncated,
            "elapsed_s": round(self.elapsed_s, 4),
        }


def read_only_connection(profile: Profile):  # noqa: ANN201 - duckdb.DuckDBPyConnection
    """A DuckDB connection that sees the profile's tables and nothing else on disk.

    The tables are registered as pyarrow datasets first; then external access is switched off
    (it cannot be switched back on) and the configuration locked, so SQL cannot read, write or
    attach files.
    """
    import duckdb

    con = duckdb.connect(":memory:")
    for name in TABLES:
        con.register(name, profile.dataset(name))
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'").fetchall()
    con.execute(f"SET threads = {QUERY_THREADS}").fetchall()
    con.execute("SET enable_external_access = false").fetchall()
    con.execute("SET lock_configuration = true").fetchall()
    return con


def run_query(
    profile: Profile,
    sql: str,
    limit: int = DEFAULT_LIMIT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> QueryResult:
    """Run one read-only SELECT (or DESCRIBE/SHOW/SUMMARIZE) statement.

    Returns at most `limit` rows; raises ExplorerError for anything else (other statements,
    SQL errors, or a query still running after `timeout_s`, which is interrupted).
    """
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise ExplorerError(f"query: {_first_line(e)}") from None
    if len(statements) != 1:
        raise ExplorerError(f"query: expected one SQL statement, got {len(statements)}")
    if statements[0].type != duckdb.StatementType.SELECT:
        kind = statements[0].type.name
        raise ExplorerError(f"query: only read-only SELECT statements run here, not {kind}")
    con = read_only_connection(profile)
    timer = threading.Timer(timeout_s, con.interrupt)
    start = time.perf_counter()
    timer.start()
    try:
        reader = con.sql(sql).to_arrow_reader(BATCH_ROWS)
        batches, rows = [], 0
        truncated = False
        for batch in reader:
            if rows + batch.num_rows > limit:
                batches.append(batch.slice(0, limit - rows))
                truncated = True
                break
            batches.append(batch)
            rows += batch.num_rows
        table = pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException:
        raise ExplorerError(f"query: stopped after the time limit of {timeout_s:g} s") from None
    except duckdb.Error as e:
        raise ExplorerError(f"query: {_first_line(e)}") from None
    finally:
        timer.cancel()
        con.close()
    return QueryResult(table, truncated, time.perf_counter() - start)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [e.__class__.__name__])[0]

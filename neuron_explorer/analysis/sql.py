"""Read-only SQL over a profile, with a row limit and a time limit. The CLI's `query` command
and the web UI's SQL page both run queries through `run_query`."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from ..errors import ExplorerError, private
from ..model.profile import Profile
from ..model.schema import ALL_TABLES

DEFAULT_LIMIT = 1000
DEFAULT_TIMEOUT_S = 30.0
MEMORY_LIMIT = "2GB"  # a runaway query fails instead of exhausting the machine
QUERY_THREADS = 1  # a runaway query holds one core until its time limit, not all of them
BATCH_ROWS = 2048
# DuckDB spills to `.tmp` in the working directory by default, and SQL can read that folder back
# (read_text('.tmp/...')) even with external access off; no temp directory means no spills at
# all: a query over the memory limit fails instead of writing hundreds of MB to disk.
NO_SPILLS = "SET temp_directory = ''"
NO_HOME = "/nonexistent"  # not a folder of this machine's users


@dataclass(frozen=True)
class QueryResult:
    """The rows of a query (at most `limit`), whether more rows were cut off, and how long it
    took (elapsed_s here; the document says elapsed_ms)."""

    table: pa.Table
    truncated: bool
    elapsed_s: float
    cut_at_bytes: int | None = None  # set when the rows were cut at this size, not at `limit`

    def to_dict(self) -> dict[str, Any]:
        """The one query-result document (`query --json`, the web's SQL answer, agents):
        rows as lists in column order (names may repeat), JSON-safe values."""
        names = self.table.column_names
        columns = [c.to_pylist() for c in self.table.columns]
        rows = [[jsonable(v) for v in r] for r in zip(*columns, strict=True)]
        return {
            "columns": names,
            "types": [str(t) for t in self.table.schema.types],
            "rows": rows,
            "row_count": len(rows),
            "truncated": self.truncated,
            "cut_at_bytes": self.cut_at_bytes,
            "elapsed_ms": round(self.elapsed_s * 1e3, 2),
        }

    def to_csv(self) -> str:
        """The rows as CSV under a header of the column names (NULL as an empty field), as
        `query --csv` prints it and the web's SQL page downloads it."""
        import csv
        import io

        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.table.column_names)
        columns = [c.to_pylist() for c in self.table.columns]
        writer.writerows(["" if v is None else v for v in r] for r in zip(*columns, strict=True))
        return buf.getvalue()


def jsonable(v: Any) -> Any:
    """A value as JSON can hold it: numbers, text, booleans, None, lists and dicts of them;
    a whole-number Decimal as an int; anything else (a timestamp, a fraction) as its text."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, Decimal) and v == v.to_integral_value():
        return exact_number(v)
    return str(v)


def exact_number(v: Any) -> Any:
    """A whole-number Decimal as an int: DuckDB's sum() of integer ns is a HUGEINT, which Arrow
    hands over as a Decimal, and JSON readers should get the number, not its text."""
    if isinstance(v, Decimal) and v == v.to_integral_value():
        return int(v)
    return v


def read_only_connection(profile: Profile, memory_limit: str = MEMORY_LIMIT):
    """A DuckDB connection that sees the profile's tables and nothing else on disk.

    The tables are registered as pyarrow datasets first; then spills to disk, and external
    access, are switched off (neither can be switched back on) and the configuration locked,
    so SQL cannot read, write or attach files.
    """
    import duckdb

    con = duckdb.connect(":memory:")
    for name in ALL_TABLES:
        con.register(name, profile.relation(name))
    con.execute(NO_SPILLS).fetchall()
    con.execute("SET enable_progress_bar = false").fetchall()  # never print into a server's log
    con.execute(f"SET memory_limit = '{memory_limit}'").fetchall()
    con.execute(f"SET threads = {QUERY_THREADS}").fetchall()
    # DuckDB's own folders default to the server user's home, which settings and errors show
    for setting in ("home_directory", "extension_directory", "secret_directory"):
        con.execute(f"SET {setting} = '{NO_HOME}'").fetchall()
    con.execute("SET allow_persistent_secrets = false").fetchall()
    con.execute("SET enable_external_access = false").fetchall()
    con.execute("SET lock_configuration = true").fetchall()
    return con


def run_query(
    profile: Profile,
    sql: str,
    limit: int = DEFAULT_LIMIT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_limit: str = MEMORY_LIMIT,
    max_bytes: int | None = None,
) -> QueryResult:
    """Run one read-only SELECT (or DESCRIBE/SHOW/SUMMARIZE) statement.

    Returns at most `limit` rows, and rows of at most about `max_bytes` (Arrow size) when given;
    raises ExplorerError for anything else (other statements, SQL errors, a query over
    `memory_limit`, or one still running after `timeout_s`, which is interrupted).
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
    con = read_only_connection(profile, memory_limit)
    timer = threading.Timer(timeout_s, con.interrupt)
    start = time.perf_counter()
    timer.start()
    try:
        reader = con.sql(sql).to_arrow_reader(BATCH_ROWS)
        batches, rows, size = [], 0, 0
        truncated, cut_at = False, None
        for batch in reader:
            if rows + batch.num_rows > limit:
                batch, truncated = batch.slice(0, limit - rows), True
            if max_bytes is not None and size + batch.nbytes > max_bytes:
                batch = _fit(batch, max_bytes - size)
                truncated, cut_at = True, max_bytes
            batches.append(batch)
            rows += batch.num_rows
            size += batch.nbytes
            if truncated:
                break
        table = pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException:
        raise ExplorerError(f"query: stopped after the time limit of {timeout_s:g} s") from None
    except duckdb.Error as e:
        raise ExplorerError(f"query: {_first_line(e)}") from None
    finally:
        timer.cancel()
        con.close()
    return QueryResult(table, truncated, time.perf_counter() - start, cut_at)


def _fit(batch: pa.RecordBatch, budget: int) -> pa.RecordBatch:
    """The longest first slice of `batch` whose size is within `budget` bytes."""
    lo, hi = 0, batch.num_rows
    while lo < hi:  # binary search: sizes grow with the row count
        mid = (lo + hi + 1) // 2
        if batch.slice(0, mid).nbytes <= budget:
            lo = mid
        else:
            hi = mid - 1
    return batch.slice(0, lo)


def _first_line(e: Exception) -> str:
    return private((str(e).strip().splitlines() or [e.__class__.__name__])[0])

"""The SQL box: one read-only SELECT over the profile's tables through neuron_explorer.analysis's
run_query (Arrow datasets registered, then external access off and the configuration locked),
with the web page's row and time limits and example queries."""

from __future__ import annotations

from typing import Any

from neuron_explorer.errors import ExplorerError
from neuron_explorer.model import Profile

MAX_ROWS = 10_000
DEFAULT_ROWS = 1_000
TIMEOUT_S = 10.0
MAX_SQL_CHARS = 10_000  # the SQL box's text arrives in the URL; no real query needs more

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


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def run_query(
    profile: Profile, sql: str, limit: int = DEFAULT_ROWS, timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    """neuron_explorer.analysis.run_query (read only, limited) with its rows as JSON-safe lists."""
    from neuron_explorer.analysis import run_query as analysis_query

    if not sql.strip():
        raise QueryError("query: empty")
    if len(sql) > MAX_SQL_CHARS:
        raise QueryError(f"query: longer than the limit of {MAX_SQL_CHARS} characters")
    limit = max(1, min(int(limit), MAX_ROWS))
    try:
        res = analysis_query(profile, sql, limit=limit, timeout_s=timeout_s)
    except ExplorerError as e:
        raise QueryError(str(e)) from None
    cols = res.table.column_names
    rows = [[_jsonable(r[c]) for c in cols] for r in res.table.to_pylist()]
    return {"columns": cols, "types": [str(t) for t in res.table.schema.types], "rows": rows,
            "row_count": len(rows), "truncated": res.truncated,
            "elapsed_ms": round(res.elapsed_s * 1e3, 2)}  # fmt: skip

"""Find events by name: a case-insensitive substring, or a regular expression (RE2, so a
hostile pattern still runs in linear time). The timeline steps through the matches and
highlights the names matched."""

from __future__ import annotations

from typing import Any

from . import fetch_dicts
from .sql import QueryError

MAX_QUERY_CHARS = 500
MAX_MATCHES = 1000  # events sent back, in time order; `total` counts them all
MAX_NAMES = 2000  # distinct matched names sent back, for highlighting


def _predicate(regex: bool) -> str:
    # names are matched once per distinct name (the column is dictionary-encoded and names
    # repeat), then the events carrying one of them are selected
    return "regexp_matches(n, ?)" if regex else "contains(lower(n), lower(?))"


def search_events(con, q: str, regex: bool = False, limit: int = MAX_MATCHES) -> dict[str, Any]:
    """Events whose name matches `q`: the first `limit` in time order, their total count, and
    the distinct names matched."""
    import duckdb

    q = q.strip()
    if not q:
        raise QueryError("search: empty")
    if len(q) > MAX_QUERY_CHARS:
        raise QueryError(f"search: longer than the limit of {MAX_QUERY_CHARS} characters")
    limit = max(1, min(int(limit), MAX_MATCHES))
    names_sql = (f"SELECT n FROM (SELECT DISTINCT CAST(name AS VARCHAR) AS n FROM events) "
                 f"WHERE n IS NOT NULL AND {_predicate(regex)}")  # fmt: skip
    try:
        names = [r[0] for r in con.execute(names_sql, [q]).fetchall()]
        if not names:
            return {"query": q, "regex": regex, "total": 0, "matches": [], "names": [],
                    "truncated": False}  # fmt: skip
        found = f"WITH m AS ({names_sql}) "
        joined = "FROM events e JOIN m ON CAST(e.name AS VARCHAR) = m.n"
        total = con.execute(f"{found} SELECT count(*) {joined}", [q]).fetchall()[0][0]
        rows = fetch_dicts(
            con,
            f"{found} SELECT e.id, e.rank, CAST(e.layer AS VARCHAR) AS layer, "
            "CAST(e.kind AS VARCHAR) AS kind, m.n AS name, CAST(e.track AS VARCHAR) AS track, "
            f"CAST(e.device AS VARCHAR) AS device, e.start_ns, e.dur_ns {joined} "
            "ORDER BY e.start_ns, e.id LIMIT ?",
            [q, limit],
        )
    except duckdb.Error as e:
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
        raise QueryError(f"search: {first}") from None
    return {"query": q, "regex": regex, "total": total, "matches": rows,
            "names": sorted(names)[:MAX_NAMES], "truncated": total > len(rows)}  # fmt: skip

"""Views compute the model each page shows, from a profile and its DuckDB connection."""

from __future__ import annotations

from typing import Any


def fetch_dicts(con, sql: str, params: list[Any] | tuple = ()) -> list[dict[str, Any]]:
    """Run a query and return its rows as dicts keyed by column name."""
    rel = con.execute(sql, list(params))
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, r, strict=True)) for r in rel.fetchall()]

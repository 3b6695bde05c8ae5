"""SQL over the profile's tables (the page, its CSV) and the tables themselves as Parquet."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi.responses import FileResponse, Response
from starlette.concurrency import run_in_threadpool

from neuron_explorer.model.schema import ALL_TABLES

from ..pages import Api, Page, Shell
from ..responses import attachment
from ..store import NotFound
from ..views import sql

if TYPE_CHECKING:
    from ..service import Service

PARQUET = "application/vnd.apache.parquet"
# the schema panel: every table's columns with their type, unit and meaning (model/schema.py)
SCHEMA = [
    {"table": t.name, "doc": t.doc,
     "columns": [{"name": c.name, "type": str(c.type), "unit": c.unit, "doc": c.doc} for c in t.columns]}
    for t in ALL_TABLES.values()
]  # fmt: skip


# SQL runs on the gate's own threads (async routes hold no thread of the shared pool while
# they wait), so a flood of queries never delays the pages and static files
async def _gated(svc: Service, fn: Callable[[], Any]) -> Any:
    return await asyncio.wrap_future(svc.gate.submit(fn))


async def api_sql(
    svc: Service, name: str, q: str = "", limit: int = sql.DEFAULT_ROWS
) -> dict[str, Any]:
    def answer() -> dict[str, Any]:
        p = svc.store.open(name)
        out: dict[str, Any] = {"name": name, "max_rows": sql.MAX_ROWS, "timeout_s": sql.TIMEOUT_S,
                               "max_result_bytes": sql.MAX_RESULT_BYTES,
                               "examples": [{"title": t, "sql": s} for t, s in sql.EXAMPLES],
                               "tables": list(ALL_TABLES), "schema": SCHEMA, "result": None}  # fmt: skip
        if q.strip():
            out["result"] = sql.run_query(p, q, limit)
        return out

    return await _gated(svc, answer) if q.strip() else await run_in_threadpool(answer)


async def api_sql_csv(svc: Service, name: str, q: str, limit: int = sql.MAX_ROWS) -> Response:
    res = await _gated(svc, lambda: sql.query(svc.store.open(name), q, limit))
    return Response(res.to_csv(), media_type="text/csv",
                    headers=attachment(f"{name}-query.csv"))  # fmt: skip


def api_table(svc: Service, name: str, table: str) -> Response:
    p = svc.store.open(name)
    if table not in ALL_TABLES:
        raise NotFound(f"no table {table!r}; tables are {', '.join(ALL_TABLES)}")
    data, headers = p.parquet(table), attachment(f"{name}-{table}.parquet")
    if isinstance(data, Path):  # the table's own file, streamed
        return FileResponse(data, media_type=PARQUET, headers=headers)
    return Response(data, media_type=PARQUET, headers=headers)


PAGES = (Page("sql", "/p/{name}/sql", api_sql, Shell("SQL", "sql.js", tab="SQL")),)
API = (
    Api("/api/p/{name}/sql.csv", api_sql_csv, "sql"),
    Api("/api/p/{name}/tables/{table}.parquet", api_table, "sql"),
)

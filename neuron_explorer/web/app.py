"""The FastAPI app: every page at PATH is a static shell whose script reads its JSON twin at
/api/PATH; the views compute, this module only routes, caches and turns errors into responses."""

from __future__ import annotations

import asyncio
import html
import io
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from neuron_explorer.analysis import hotspots
from neuron_explorer.analysis.context import context
from neuron_explorer.model import Profile
from neuron_explorer.model.schema import TABLES

from . import cache_dir
from .cache import AnalysisCache, profile_identity
from .guard import Guard
from .listing import ProfileList
from .pages import PAGES, render_page
from .responses import attachment as _attachment
from .responses import install_error_handlers
from .store import NotFound, ProfileStore
from .views import compare, events, memory, operators, overview, search, source, span, sql, timeline

STATIC = Path(__file__).resolve().parent / "static"
NS_LIMIT = 2**62  # times in a URL beyond int64 nanoseconds are refused (422), not a 500
# The profile list analyses profiles up to this size on the spot (well under a second each), for
# up to LIST_INLINE_S per request; the others show their top finding once known (from the disk
# cache, or a background analysis), so a folder of many or large profiles lists at once.
LIST_INLINE_EVENTS = 200_000
LIST_INLINE_S = 1.0


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


# which frame is "the line" in the source view: your code, model code or every frame
LEVEL = Query("model", pattern="^(user|model|all)$")


def create_app(
    root: str | Path,
    allowed_hosts: list[str] | None = None,
    analysis_cache: str | Path | None = None,
) -> FastAPI:
    """The app serving the profile (or directory of profiles) at `root`. `allowed_hosts` limits
    the Host header (serve sets it on loopback, so a DNS-rebinding page cannot read profiles).
    Analysis results persist under `analysis_cache` (default: the user cache, web/cache.py)."""
    store = ProfileStore(root)
    disk = AnalysisCache(analysis_cache or cache_dir() / "analysis")
    # one profile analysed at a time in the background, leaving the other core to requests
    background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="analysis")
    pending: set[str] = set()
    side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tables")
    pending_lock = threading.Lock()
    # no /api/docs: Swagger UI would load scripts from a CDN into the origin that serves source
    app = FastAPI(title="Neuron Explorer", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json")  # fmt: skip
    app.state.store = store
    gate = app.state.sql_gate = sql.QueryGate()
    if allowed_hosts:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    app.add_middleware(Guard)

    install_error_handlers(app)

    # ---- cached per profile (in memory, and on disk for what takes seconds to compute) ---
    def persisted(name: str, kind: str, compute: Callable[[Profile], Any]) -> Any:
        def make(p: Profile) -> Any:
            identity = store.derived(name, "identity", profile_identity)
            value = disk.load(p, kind, identity)
            if value is None:
                value = compute(p)
                disk.store(p, kind, identity, value)
            return value

        return store.derived(name, kind, make)

    def index(name: str) -> timeline.TimelineIndex:
        return store.derived(
            name, "timeline", lambda p: timeline.build_index(p, store.connection(name))
        )

    def ops(name: str):  # pyarrow table
        return persisted(name, "ops_table", lambda p: operators.operator_table(context(p).cols))

    def lines(name: str):  # pyarrow table
        return persisted(name, "lines_table", lambda p: source.line_table(context(p).cols))

    def model_lines(name: str, level: str = "model"):  # device self/total per line, any file
        return persisted(name, f"lines_table_{level}",
                         lambda p: source.model_line_table(p, p.duckdb(), level))  # fmt: skip

    # neuron_explorer.analysis keeps one DuckDB connection per profile: one analysis call at a time
    def summary(name: str) -> dict[str, Any] | None:
        def make(p):
            with store.profile_lock(name):
                return overview.analysis_summary(p)

        return persisted(name, "summary", make)

    def findings(name: str) -> list[dict[str, Any]] | None:
        def make(p):
            with store.profile_lock(name):
                found = overview.analysis_findings(p)
            for f in found or ():  # so the page can link evidence lines to the source view
                ev = f.get("evidence", {})
                for line in (*ev.get("source_lines", ()), *ev.get("model_lines", ())):
                    if line.get("file"):
                        line["file_id"] = source.file_id(line["file"])
            return found

        return persisted(name, "findings", make)

    def devices(name: str) -> list[str]:
        return persisted(name, "devices", overview.devices)

    def known_findings(
        name: str, p: Profile, inline: bool
    ) -> tuple[bool, list[dict[str, Any]] | None]:
        """The findings if computed (here or by an earlier server), or computed now when
        `inline` and the profile is small; else (False, None), for the background."""
        events = int(p.manifest.row_counts.get("events") or 0)
        if store.has(name, "findings") or (inline and events <= LIST_INLINE_EVENTS):
            return True, findings(name)
        identity = store.derived(name, "identity", profile_identity)
        if disk.load(p, "findings", identity) is not None:
            return True, findings(name)  # read back into memory
        return False, None

    def analyse_later(names: list[str]) -> None:
        """Queue the analysis of profiles the list could not show yet (one at a time)."""
        with pending_lock:
            for name in names:
                if name not in pending:
                    pending.add(name)
                    background.submit(_analyse_later, name)

    def _analyse_later(name: str) -> None:
        try:
            findings(name), summary(name)
        except Exception:  # noqa: BLE001 - a broken profile reports itself when visited
            pass
        finally:
            with pending_lock:
                pending.discard(name)

    def warm_up() -> None:
        """Compute what the first visit of each profile needs (run in a background thread)."""
        for name in store.names():
            try:
                index(name), ops(name), lines(name), summary(name), findings(name)
            except Exception:  # noqa: BLE001 - a broken profile reports itself when visited
                continue

    app.state.warm_up = warm_up

    # ---- JSON ----------------------------------------------------------------------------
    def profile_row(name: str, start: float) -> dict[str, Any]:
        p = store.open(name)
        inline = time.monotonic() - start < LIST_INLINE_S
        known, found = known_findings(name, p, inline)
        row = overview.profile_row(name, p, devices(name), found)
        return {**row, "analysis_pending": not known}

    listing = ProfileList()

    @app.get("/api/profiles")
    def api_profiles() -> dict[str, Any]:
        names, skipped = store.scan()
        start = time.monotonic()  # small profiles are analysed inline for LIST_INLINE_S in all
        rows = listing.rows(names, lambda name: profile_row(name, start))
        # after the list is built, which then does not wait for them
        analyse_later([r["name"] for r in rows if r.get("analysis_pending")])
        return {"root": str(store.root), "profiles": rows, "skipped": skipped}

    @app.get("/api/p/{name}")
    def api_summary(name: str) -> dict[str, Any]:
        p = store.open(name)
        m = p.manifest
        if not (store.has(name, "ops_table") and store.has(name, "lines_table")):
            # the tables (numpy, GIL mostly released) while this thread runs the rules
            side.submit(lambda: (ops(name), lines(name)))
        f = findings(name)
        modeled = overview.is_modeled(p)
        return {
            "name": name,
            "manifest": {
                "source": m.source,
                "producer": m.producer,
                "torch_version": m.torch_version,
                "host": m.host,
                "ranks": list(m.ranks),
                "device_spec": m.device_spec,
                "devices": list(m.devices),
                "row_counts": m.row_counts,
                "inputs": list(m.inputs),
            },  # fmt: skip
            "device_time_modeled": modeled,
            "devices": devices(name),
            "steps": overview.step_stats(p),
            "summary": summary(name),
            "findings": None if f is None else f[:5],
            "findings_total": None if f is None else len(f),
            "top_ops": operators.operators_json(ops(name), m.device_spec, modeled)["operators"][
                :10
            ],
            "top_lines": source.top_lines(lines(name)),
        }

    @app.get("/api/p/{name}/timeline")
    def api_timeline(
        name: str,
        start_ns: int | None = Query(None, ge=-NS_LIMIT, le=NS_LIMIT),
        end_ns: int | None = Query(None, ge=-NS_LIMIT, le=NS_LIMIT),
        width_px: int = 1500,
    ) -> dict[str, Any]:
        p = store.open(name)
        idx = index(name)
        first = idx.fit[:2] if idx.fit else (idx.start_ns, idx.end_ns)  # where the events are
        s = first[0] if start_ns is None else start_ns
        e = first[1] if end_ns is None else end_ns
        if start_ns is None and end_ns is None:  # the first view of every visit: computed once
            width_px = min(8000, max(250, round(width_px / 250) * 250))  # a few cached widths
            win = store.derived(name, f"timeline-all-{width_px}",
                                lambda _: timeline.window(p, store.connection(name), idx, s, e, width_px))  # fmt: skip
        else:
            win = timeline.window(p, store.connection(name), idx, s, e, width_px)
        return {"name": name, "device_time_modeled": overview.is_modeled(p),
                "extent": {"start_ns": idx.start_ns, "end_ns": idx.end_ns},
                "fit": None if idx.fit is None else
                {"start_ns": idx.fit[0], "end_ns": idx.fit[1], "outside_events": idx.fit[2]},
                "lanes": timeline.lanes_json(idx), "steps": list(idx.steps), "window": win}  # fmt: skip

    @app.get("/api/p/{name}/events/{event_id}")
    def api_event(name: str, event_id: int) -> dict[str, Any]:
        store.open(name)
        out = events.event_json(store.connection(name), event_id)
        if out is None:
            raise NotFound(f"no event {event_id} in {name}")
        return out

    @app.get("/api/p/{name}/memory")
    def api_memory(name: str) -> dict[str, Any]:
        p = store.open(name)
        found = store.derived(
            name, "memory", lambda p: memory.memory_json(p, store.connection(name))
        )
        return {"name": name, "device_time_modeled": overview.is_modeled(p), **found}

    @app.get("/api/p/{name}/counters")
    def api_counters(
        name: str,
        start_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
        end_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
        width_px: int = Query(1500, ge=1, le=8000),
    ) -> dict[str, Any]:
        store.open(name)
        con = store.connection(name)
        return {"name": name, "counters": memory.counter_series(con, start_ns, end_ns, width_px)}

    @app.get("/api/p/{name}/span")
    def api_span(
        name: str,
        start_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
        end_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
    ) -> dict[str, Any]:
        p = store.open(name)
        return {"name": name, "device_time_modeled": overview.is_modeled(p),
                **span.span_totals(store.connection(name), start_ns, end_ns)}  # fmt: skip

    @app.get("/api/p/{name}/search")
    def api_search(
        name: str, q: str, regex: bool = False, limit: int = search.MAX_MATCHES
    ) -> dict[str, Any]:
        store.open(name)
        return {"name": name, **search.search_events(store.connection(name), q, regex, limit)}

    @app.get("/api/p/{name}/operators")
    def api_operators(name: str) -> dict[str, Any]:
        p = store.open(name)
        return {"name": name, **operators.operators_json(ops(name), p.manifest.device_spec,
                                                         overview.is_modeled(p))}  # fmt: skip

    @app.get("/api/p/{name}/operators/detail")
    def api_operator(name: str, op: str) -> dict[str, Any]:
        store.open(name)
        out = operators.operator_detail(store.connection(name), op)
        for line in out["lines"]:
            line["file_id"] = source.file_id(line["file"])
        return out

    @app.get("/api/p/{name}/source")
    def api_source(name: str, level: str = LEVEL) -> dict[str, Any]:
        p = store.open(name)
        t = lines(name)
        m = model_lines(name, level)
        return {"name": name, "files": source.files_json(t, p), "top_lines": source.top_lines(t, 50),
                "level": level, "model_files": source.model_files_json(m, p),
                "top_model_lines": source.top_model_lines(m),
                "device_time_modeled": overview.is_modeled(p)}  # fmt: skip

    @app.get("/api/p/{name}/modules")
    def api_modules(name: str) -> dict[str, Any]:
        p = store.open(name)
        nodes = store.derived(name, "module_tree", lambda p: hotspots.module_tree(p, p.duckdb()))
        ops = store.derived(name, "module_ops", lambda p: hotspots.module_ops(p, p.duckdb()))
        return {"name": name, "modules": [m.to_dict() for m in nodes], "ops": ops,
                "device_time_modeled": overview.is_modeled(p)}  # fmt: skip

    def _file(name: str, file_id: str) -> str:
        path = source.find_file(lines(name), file_id, model_lines(name))
        if path is None:
            raise NotFound(f"no source file {file_id!r} in {name}")
        return path

    @app.get("/api/p/{name}/source/{file_id}")
    def api_source_file(name: str, file_id: str, level: str = LEVEL) -> dict[str, Any]:
        p = store.open(name)
        path = _file(name, file_id)
        return {"name": name, "level": level,
                **source.file_json(p, lines(name), path, overview.is_modeled(p),
                                   model_lines(name, level))}  # fmt: skip

    @app.get("/api/p/{name}/source/{file_id}/lines/{line}")
    def api_source_line(name: str, file_id: str, line: int) -> dict[str, Any]:
        store.open(name)
        return source.line_detail(store.connection(name), _file(name, file_id), line)

    @app.get("/api/p/{name}/findings")
    def api_findings(name: str) -> dict[str, Any]:
        store.open(name)
        f = findings(name)
        return {"name": name, "available": f is not None, "findings": f or []}

    # SQL runs on the gate's own threads (async routes hold no thread of the shared pool while
    # they wait), so a flood of queries never delays the pages and static files
    async def gated(fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(gate.submit(fn))

    @app.get("/api/p/{name}/sql")
    async def api_sql(name: str, q: str = "", limit: int = sql.DEFAULT_ROWS) -> dict[str, Any]:
        def answer() -> dict[str, Any]:
            p = store.open(name)
            out: dict[str, Any] = {"name": name, "max_rows": sql.MAX_ROWS, "timeout_s": sql.TIMEOUT_S,
                                   "max_result_bytes": sql.MAX_RESULT_BYTES,
                                   "examples": [{"title": t, "sql": s} for t, s in sql.EXAMPLES],
                                   "tables": list(TABLES), "result": None}  # fmt: skip
            if q.strip():
                out["result"] = sql.run_query(p, q, limit)
            return out

        return await gated(answer) if q.strip() else await run_in_threadpool(answer)

    @app.get("/api/p/{name}/sql.csv")
    async def api_sql_csv(name: str, q: str, limit: int = sql.MAX_ROWS) -> Response:
        res = await gated(lambda: sql.run_query(store.open(name), q, limit))
        return _csv(name, res)

    def _csv(name: str, res: dict[str, Any]) -> Response:
        import csv

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(res["columns"])
        w.writerows(res["rows"])
        return Response(buf.getvalue(), media_type="text/csv",
                        headers=_attachment(f"{name}-query.csv"))  # fmt: skip

    @app.get("/api/p/{name}/tables/{table}.parquet")
    def api_table(name: str, table: str) -> Response:
        p = store.open(name)
        if table not in TABLES:
            raise NotFound(f"no table {table!r}; tables are {', '.join(TABLES)}")
        single = p.path / f"{table}.parquet"
        headers = _attachment(f"{name}-{table}.parquet")
        if single.is_file():
            return FileResponse(
                single, media_type="application/vnd.apache.parquet", headers=headers
            )
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(p.table(table), buf, compression="zstd")
        return Response(
            buf.getvalue(), media_type="application/vnd.apache.parquet", headers=headers
        )

    def kernels(name: str):  # pyarrow table of kernels by name
        con = store.connection(name)
        return store.derived(name, "kernel_table", lambda p: compare.kernel_table(con))

    @app.get("/api/compare")
    def api_compare(a: str = Query(...), b: str = Query(...)) -> dict[str, Any]:
        pa_, pb_ = store.open(a), store.open(b)
        sa, sb = overview.step_stats(pa_), overview.step_stats(pb_)
        suma, sumb = summary(a), summary(b)
        return {
            "a": a, "b": b,
            "steps": {"a": sa, "b": sb},
            "step_ns_delta": (sb["step_ns_mean"] - sa["step_ns_mean"])
            if sa["step_ns_mean"] is not None and sb["step_ns_mean"] is not None else None,
            "breakdown": compare.compare_breakdown(suma, sumb),
            "ops": compare.compare_ops(ops(a), ops(b))[:200],
            "lines": compare.compare_lines(lines(a), lines(b))[:200],
            "kernels": compare.compare_kernels(kernels(a), kernels(b))[:200],
            "findings": compare.compare_findings(findings(a), findings(b)),
            "device_time_modeled": overview.is_modeled(pa_) or overview.is_modeled(pb_),
        }  # fmt: skip

    # ---- pages ---------------------------------------------------------------------------
    @app.get("/static/plotly.min.js")
    def plotly_js() -> FileResponse:
        return FileResponse(_plotly_js(), media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=86400"})  # fmt: skip

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    def page(kind: str, name: str | None = None, **extra: str) -> HTMLResponse:
        if name is not None:
            store.open(name)  # a 404 page for unknown names, an error page for a corrupt profile
        title = f"{PAGES[kind].title} · {name}" if name else PAGES[kind].title
        return HTMLResponse(render_page(kind, title=title, profile=name or "", **extra))

    @app.get("/", response_class=HTMLResponse)
    def page_profiles() -> HTMLResponse:
        return page("profiles")

    @app.get("/compare", response_class=HTMLResponse)
    def page_compare() -> HTMLResponse:
        return page("compare")

    @app.get("/p/{name}", response_class=HTMLResponse)
    def page_summary(name: str) -> HTMLResponse:
        return page("summary", name)

    for kind in ("timeline", "memory", "operators", "modules", "source", "findings", "sql"):
        app.add_api_route(f"/p/{{name}}/{kind}", _page_route(page, kind),
                          response_class=HTMLResponse, methods=["GET"])  # fmt: skip

    @app.get("/p/{name}/source/{file_id}", response_class=HTMLResponse)
    def page_source_file(name: str, file_id: str) -> HTMLResponse:
        return page("source", name, file_id=html.escape(file_id))

    return app


def _page_route(page, kind: str):  # a route function for one page kind
    def route(name: str) -> HTMLResponse:
        return page(kind, name)

    route.__name__ = f"page_{kind}"
    return route

"""The timeline (windows, events, spans, find) and the memory page with its counter track."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Query
from fastapi.responses import Response

from ..pages import Api, Page, Shell
from ..responses import encoded
from ..store import NotFound
from ..views import events, memory, overview, search, span, timeline

if TYPE_CHECKING:
    from ..service import Service

NS_LIMIT = 2**62  # times in a URL beyond int64 nanoseconds are refused (422), not a 500
LANES = Query(None, pattern=r"^\d{1,6}(,\d{1,6})*$", max_length=7000)  # the lanes' numbers


def _lanes(svc: Service, name: str, text: str | None) -> list[tuple[Any, ...]] | None:
    """The (rank, layer, device, track) of each lane number in `text` (all lanes when None)."""
    if text is None:
        return None
    rows = svc.index(name).lanes.to_pylist()
    out = []
    for n in dict.fromkeys(int(x) for x in text.split(",")):
        if n >= len(rows):
            raise NotFound(f"no lane {n} in {name} (it has {len(rows)})")
        out.append(tuple(rows[n][c] for c in ("rank", "layer", "device", "track")))
    return out


def api_timeline(
    svc: Service,
    name: str,
    start_ns: int | None = Query(None, ge=-NS_LIMIT, le=NS_LIMIT),
    end_ns: int | None = Query(None, ge=-NS_LIMIT, le=NS_LIMIT),
    width_px: int = 1500,
    window_only: bool = False,
) -> Response:
    store = svc.store
    p = store.open(name)
    idx = svc.index(name)
    first = timeline.first_view(idx)  # where the events are
    s = first[0] if start_ns is None else start_ns
    e = first[1] if end_ns is None else end_ns
    if start_ns is None and end_ns is None:  # the first view of every visit: computed once
        win = svc.first_window(name, width_px)
    else:
        win = svc.window(name, s, e, width_px)
    # encoded here: a window is asked for at every zoom, and its steps are most of a long
    # profile's page (numbers only: not walked for strings to clip)
    return encoded(timeline.page(name, p, idx, win, window_only), plain=("steps",))


def api_event(svc: Service, name: str, event_id: int) -> dict[str, Any]:
    own = svc.store.open(name).path / "events.parquet"  # (a directory of parts: None)
    out = events.event_json(svc.store.connection(name), event_id,
                            str(own) if own.is_file() else None)  # fmt: skip
    if out is None:
        raise NotFound(f"no event {event_id} in {name}")
    return out


def api_span(
    svc: Service,
    name: str,
    start_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
    end_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
    lanes: str | None = LANES,
) -> dict[str, Any]:
    p = svc.store.open(name)
    on = _lanes(svc, name, lanes)
    return {"name": name, "device_time_modeled": overview.is_modeled(p),
            **span.span_totals(svc.store.connection(name), start_ns, end_ns, on)}  # fmt: skip


def api_span_flame(
    svc: Service,
    name: str,
    start_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
    end_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
    lanes: str | None = LANES,
) -> dict[str, Any]:
    p = svc.store.open(name)
    on = _lanes(svc, name, lanes)
    svc.check_flame(name, start_ns, end_ns)  # a span of millions of events: 503 before reading
    return {"name": name, "device_time_modeled": overview.is_modeled(p),
            **span.span_flame(svc.store.connection(name), start_ns, end_ns, on)}  # fmt: skip


def api_search(
    svc: Service, name: str, q: str, regex: bool = False, limit: int = search.MAX_MATCHES
) -> dict[str, Any]:
    return {"name": name, **svc.find(name, q, regex, limit)}


def api_memory(svc: Service, name: str) -> dict[str, Any]:
    store = svc.store
    p = store.open(name)
    found = store.derived(name, "memory", lambda p: memory.memory_json(p, store.connection(name)))
    return {"name": name, "device_time_modeled": overview.is_modeled(p), **found}


def api_counters(
    svc: Service,
    name: str,
    start_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
    end_ns: int = Query(..., ge=-NS_LIMIT, le=NS_LIMIT),
    width_px: int = Query(1500, ge=1, le=8000),
) -> dict[str, Any]:
    own = svc.store.open(name).path / "counters.parquet"  # (a directory of parts: None)
    con = svc.store.connection(name)
    return {"name": name, "counters": memory.counter_series(
        con, start_ns, end_ns, width_px, str(own) if own.is_file() else None)}  # fmt: skip


PAGES = (
    Page("timeline", "/p/{name}/timeline", api_timeline,
         Shell("Timeline", "timeline.js", tab="Timeline")),
    Page("memory", "/p/{name}/memory", api_memory,
         Shell("Memory", "memory.js", plotly=True, tab="Memory")),
)  # fmt: skip
API = (
    Api("/api/p/{name}/events/{event_id}", api_event, "timeline"),
    Api("/api/p/{name}/span", api_span, "timeline"),
    Api("/api/p/{name}/span/flame", api_span_flame, "timeline"),
    Api("/api/p/{name}/search", api_search, "timeline"),
    Api("/api/p/{name}/counters", api_counters, "timeline"),
)

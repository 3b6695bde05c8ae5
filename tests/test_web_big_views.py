"""Views that failed on a 10 GB trace's profile (38 M events) under `serve --max-memory 2G`
(benchmarks/web_big_tour.py, issue 31), on small real profiles with the server's DuckDB
memory made as tight relative to them: an event's details (its enclosing events once held
every event's id in a recursive join's hash table: 500, out of memory), and a query past the
DuckDB share of the ceiling (a whole profile's span flame graph) is a 503 that says what to
do, not a 500."""

from __future__ import annotations

import duckdb
import pytest
from fastapi.testclient import TestClient
from test_web_support import build_root

from neuron_explorer.analysis.events import event_detail
from neuron_explorer.model import Profile
from neuron_explorer.web.app import create_app

# DuckDB's limit here (two threads): what an event's lookups need, below what the recursive
# join of its enclosing events took on these profiles (as 488 MB was on 38 M events)
TIGHT = "12MB"


def _nested(con: duckdb.DuckDBPyConnection) -> tuple[int, list[int]]:
    """The most deeply nested event and its parent chain, walked in Python."""
    parent = dict(con.execute("SELECT id, parent_id FROM events").fetchall())

    def chain(eid: int) -> list[int]:
        out, p = [], parent[eid]
        while p is not None and len(out) < 33:
            out.append(p)
            p = parent.get(p)
        return out

    eid = max(parent, key=lambda i: len(chain(i)))
    return eid, chain(eid)


@pytest.mark.parametrize("name", ["alexnet", "cpu_mlp"])
def test_event_details_fit_in_a_tight_duckdb(imported_profiles, name):
    p = Profile.open(imported_profiles[name])
    con = duckdb.connect()
    con.execute("SET threads = 2")
    for table in ("events", "stacks", "counters"):
        con.register(table, p.dataset(table))
    eid, chain = _nested(con)
    assert len(chain) >= 3
    con.execute(f"SET memory_limit = '{TIGHT}'")
    d = event_detail(con, eid)
    assert d is not None and [a["id"] for a in d.ancestors] == chain
    assert [a["lvl"] for a in d.ancestors] == list(range(len(chain)))


@pytest.fixture(scope="module")
def tight(tmp_path_factory, imported_profiles):
    root = build_root(tmp_path_factory.mktemp("web-tight"), imported_profiles)
    app = create_app(root, analysis_cache=tmp_path_factory.mktemp("cache"))
    app.state.store.duckdb_memory = 12 << 20  # each connection's limit, as a ceiling sets it
    return TestClient(app)


def test_a_query_past_the_duckdb_share_is_a_503_that_says_what_to_do(tight):
    ext = tight.get("/api/p/alexnet/timeline?width_px=200").json()["extent"]
    r = tight.get("/api/p/alexnet/span/flame",
                  params={"start_ns": ext["start_ns"], "end_ns": ext["end_ns"]})  # fmt: skip
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert "--max-memory" in error and "shorter span" in error and "goes on serving" in error
    # the server goes on serving: an event's details, within the same limit
    eid = tight.get("/api/p/alexnet/search", params={"q": "aten::"}).json()["matches"][0]["id"]
    assert tight.get(f"/api/p/alexnet/events/{eid}").status_code == 200

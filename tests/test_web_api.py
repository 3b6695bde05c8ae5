"""Every JSON route of the web UI on real imported GPU traces and a neuron-shaped profile, with
the security rules: names and paths from URLs stay inside the served directory, SQL is read
only and limited, HTML from traces is escaped, a corrupt profile does not stop the server."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import reference_sql
from fastapi.testclient import TestClient
from test_web_support import BASE_TRACE, XSS_FILE, XSS_OP, build_root

from neuron_explorer.analysis import run_rules, timeline
from neuron_explorer.analysis.context import context
from neuron_explorer.analysis.lines import line_table
from neuron_explorer.analysis.operators import operator_table
from neuron_explorer.analysis.steps import profile_steps
from neuron_explorer.model import Profile
from neuron_explorer.web.app import create_app
from neuron_explorer.web.views import source as source_view
from neuron_explorer.web.views import sql as sql_view
from neuron_explorer.web.whole_views import FIRST_VIEW_PX

GOOD = ("alexnet", "base", "test", "cpu_mlp", "gpt", "fallback", "neuron", "xss")
NEURON = ("gpt", "fallback", "neuron")


@pytest.fixture(scope="module")
def root(tmp_path_factory, imported_profiles):
    return build_root(tmp_path_factory.mktemp("web"), imported_profiles)


@pytest.fixture(scope="module")
def client(root, tmp_path_factory):
    return TestClient(create_app(root, analysis_cache=tmp_path_factory.mktemp("analysis-cache")))


def get(client, url, status=200):
    r = client.get(url)
    assert r.status_code == status, (url, r.status_code, r.text[:300])
    return r.json() if "json" in r.headers.get("content-type", "") else r


def test_profile_list_shows_every_profile_and_the_broken_one(client):
    data = get(client, "/api/profiles")
    rows = {r["name"]: r for r in data["profiles"]}
    assert set(rows) == {*GOOD, "corrupt"}  # the symlink out of the directory is not listed
    assert rows["corrupt"]["error"] and "corrupt" in rows["corrupt"]["error"]
    assert rows["neuron"]["devices"] == ["neuron:0"] and rows["neuron"]["device_time_modeled"]
    assert rows["alexnet"]["devices"] == ["cuda:0"] and not rows["alexnet"]["device_time_modeled"]
    for name in ("base", "neuron", "cpu_mlp"):  # the summary page's step statistics, less per_step
        st = profile_steps(Profile.open(f"{data['root']}/{name}"))
        assert rows[name]["steps"] == (None if st is None else {**st.to_dict(), "per_step": []})
    neuron = Profile.open(f"{data['root']}/neuron")
    assert rows["neuron"]["steps"]["count"] == len(neuron.manifest.steps) > 0
    assert rows["alexnet"]["top_finding"]["title"]


@pytest.mark.parametrize("name", GOOD)
def test_summary_matches_the_manifest_and_analysis(client, root, name):
    d = get(client, f"/api/p/{name}")
    prof = Profile.open(root / name)
    assert (d["steps"] or {"count": 0})["count"] == len(prof.manifest.steps)  # None: no steps
    assert d["summary"]["n_events"] == prof.row_count("events")
    assert d["findings_total"] == len(run_rules(prof))
    assert d["device_time_modeled"] == (name in NEURON)
    if name in NEURON:
        assert d["summary"]["readiness"] is not None and d["summary"]["engines"]


@pytest.mark.parametrize("name", GOOD)
def test_timeline_window_accounts_for_every_event(client, root, name):
    d = get(client, f"/api/p/{name}/timeline?width_px=800")
    w = d["window"]
    con = Profile.open(root / name).duckdb()
    total = con.execute("SELECT count(*) FROM events").fetchall()[0][0]
    assert w["events"] == total == sum(w["rects"]["count"])
    assert w["rects_count"] <= timeline.MAX_RECTS
    assert {r["lane"] for r in d["lanes"]} >= set(w["rects"]["lane"])
    # a zoomed window: exactly the events that overlap it, all rectangles inside or across it
    s = d["extent"]["start_ns"] + (d["extent"]["end_ns"] - d["extent"]["start_ns"]) // 3
    e = s + (d["extent"]["end_ns"] - d["extent"]["start_ns"]) // 10
    z = get(client, f"/api/p/{name}/timeline?start_ns={s}&end_ns={e}&width_px=600")["window"]
    expected = con.execute(
        "SELECT count(*) FROM events WHERE start_ns < ? AND start_ns + dur_ns >= ?", [e, s]
    ).fetchall()[0][0]
    assert z["events"] == expected == sum(z["rects"]["count"])
    for start, dur in zip(z["rects"]["start_ns"], z["rects"]["dur_ns"], strict=True):
        assert start < e and start + dur >= s


def test_timeline_merges_to_the_rectangle_budget(root):
    prof = Profile.open(root / "neuron")
    idx = timeline.build_index(prof)
    w = timeline.window(prof, idx, idx.start_ns, idx.end_ns, 1000, max_rects=150).to_dict()
    assert w["rects_count"] <= 150
    assert sum(w["rects"]["count"]) == w["events"] == prof.row_count("events")
    assert w["merged"] > 0 and max(w["rects"]["count"]) > 1
    lanes = {(r["track"]): r["depth"] for r in idx.lanes.to_pylist()}
    assert lanes["thread 1"] == 4 and lanes["TensorE"] == 1  # step > op > op > launch


def test_the_timeline_answer_is_its_page_model_clipped(tmp_path):
    """The timeline's answer (encoded by msgspec, its steps not walked for strings) is its page
    model as every other JSON answer gives it (clip_strings, then JSON): the first view and a
    zoom, with an op name over MAX_STRING_CHARS clipped with its marker."""
    import hostile_sizes

    from neuron_explorer.web.responses import MAX_STRING_CHARS, clip_strings
    from neuron_explorer.web.views import timeline as timeline_view

    base = hostile_sizes.base_profile(tmp_path / "src" / "base", 2_000)
    hostile_sizes.huge_op_name(base, tmp_path / "served" / "long", 12_000)
    app = create_app(tmp_path / "served", analysis_cache=tmp_path / "cache")
    svc, c = app.state.service, TestClient(app)
    p, idx = svc.store.open("long"), svc.index("long")
    s = idx.start_ns + (idx.end_ns - idx.start_ns) // 4
    e = s + (idx.end_ns - idx.start_ns) // 3
    for query, win, only in (
        ("", lambda: svc.first_window("long", 1500), False),
        (f"?start_ns={s}&end_ns={e}&width_px=700&window_only=true",
         lambda: svc.window("long", s, e, 700), True),
    ):  # fmt: skip
        r = c.get(f"/api/p/long/timeline{query}")
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        doc = r.json()
        want = json.loads(json.dumps(clip_strings(timeline_view.page("long", p, idx, win(), only))))
        assert doc == want
        names = doc["window"]["names"]
        assert any(n and n.endswith(" more characters]") for n in names)
        assert max(len(n or "") for n in names) <= MAX_STRING_CHARS + 40
    assert (
        len(doc) == 3 and len(c.get("/api/p/long/timeline").json()["steps"]) == len(idx.steps) > 0
    )


def test_event_details_link_launch_kernel_and_source(client):
    ops = get(client, "/api/p/neuron/operators/detail?op=aten::addmm")
    kernel_id = ops["kernels"][0]["first_id"]
    d = get(client, f"/api/p/neuron/events/{kernel_id}")
    assert d["event"]["kind"] == "kernel"
    assert [f["kind"] for f in d["flows"]] == ["runtime"]  # the launch that caused it...
    assert {c["kind"] for c in d["children"]} == {"instruction", "dma"}  # ...its own work below
    assert d["source"]["line"] == d["event"]["src_line"]
    assert get(client, f"/api/p/neuron/source/{d['source']['file_id']}")["has_source"]
    get(client, "/api/p/neuron/events/999999999", status=404)


@pytest.mark.parametrize("name", ["gpt", "alexnet"])
def test_enclosing_events_start_at_the_direct_parent(client, name):
    """The chain of enclosing events is the whole parent chain, the direct parent first (it was
    dropped once), walked here in Python from the events table."""
    con = client.app.state.store.connection(name)
    parent = dict(con.execute("SELECT id, parent_id FROM events").fetchall())
    nested = [i for i, p in parent.items() if p is not None and parent.get(p) is not None][:40]
    assert nested
    for eid in nested:
        chain, p = [], parent[eid]
        while p is not None and len(chain) < 33:
            chain.append(p)
            p = parent.get(p)
        d = get(client, f"/api/p/{name}/events/{eid}")
        assert [a["id"] for a in d["ancestors"]] == chain, eid


def test_gpu_kernel_details_reach_the_launching_runtime_call(client):
    con = client.app.state.store.connection("alexnet")
    kid = con.execute(
        "SELECT id FROM events WHERE kind = 'gpu_kernel' AND flow_id IS NOT NULL LIMIT 1"
    ).fetchall()[0][0]
    d = get(client, f"/api/p/alexnet/events/{kid}")
    assert [f["layer"] for f in d["flows"]] and all(f["layer"] == "host" for f in d["flows"])


@pytest.mark.parametrize("name", GOOD)
def test_operators_agree_with_sql(client, root, name):
    d = get(client, f"/api/p/{name}/operators")
    con = Profile.open(root / name).duckdb()
    n_ops = con.execute("SELECT count(*) FROM events WHERE kind='op' AND layer='host'").fetchall()
    assert sum(o["count"] for o in d["operators"]) == n_ops[0][0]
    dev = con.execute(
        "SELECT coalesce(sum(dur_ns), 0) FROM events WHERE layer = 'device' AND op_name IS NOT NULL"
        " AND kind IN ('kernel','gpu_kernel','gpu_memcpy','gpu_memset','collective')"
    ).fetchall()[0][0]
    assert sum(o["device_ns"] for o in d["operators"]) == dev
    assert (d["roofline"] is not None) == (name in NEURON)


@pytest.mark.parametrize("name", GOOD)
def test_operator_and_line_tables_equal_their_sql_definition(root, name):
    """The tables are computed over numpy arrays (neuron_explorer.analysis); OPS_SQL and
    LINES_SQL (tests/reference_sql.py) define them."""
    prof = Profile.open(root / name)
    con = prof.duckdb()
    cols = context(prof).cols
    for sql, table, key in (
        (reference_sql.OPS_SQL, operator_table(cols), ("name",)),
        (reference_sql.LINES_SQL, line_table(cols), ("file", "line")),
    ):
        want = con.sql(sql).to_arrow_table()
        assert table.schema == want.schema
        assert _by(table.to_pylist(), key) == _by(want.to_pylist(), key)
        # SQL ranks the rows with both host and device time first, by their sum
        both = [r for r in want.to_pylist() if r["launches"] and r.get("count", r.get("host_ns"))]
        top = table.to_pylist()[: len(both)]
        assert [_total(r) for r in top] == [_total(r) for r in both]
        assert [_total(r) for r in both] == sorted(map(_total, both), reverse=True)


def _total(row: dict) -> int:
    return row["device_ns"] + row.get("host_self_ns", row.get("host_ns"))


def _by(rows: list[dict], key: tuple[str, ...]) -> list[dict]:
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in key))


def test_operator_detail_expands_into_kernels_and_instructions(client):
    d = get(client, "/api/p/neuron/operators/detail?op=aten::addmm")
    assert d["kernels"][0]["name"] == "kernel_addmm"
    assert {i["track"] for i in d["instructions"]} >= {"TensorE", "DMA q0"}
    assert d["lines"][0]["line"] in (6, 8)


def test_source_ranks_files_and_annotates_lines(client):
    files = get(client, "/api/p/neuron/source")["files"]
    assert files[0]["file"].endswith("train.py") and files[0]["has_source"]
    f = get(client, f"/api/p/neuron/source/{files[0]['file_id']}")
    hot = {r["line"]: r for r in f["lines"] if r["host_ns"] or r["device_ns"]}
    assert set(hot) == {6, 7, 8, 9, 13}
    assert f["lines"][5]["code"].strip() == "x = self.fc1(x)"
    assert sum(r["host_ns"] for r in f["lines"]) == files[0]["host_ns"]
    line = get(client, f"/api/p/neuron/source/{files[0]['file_id']}/lines/8")
    assert {o["name"] for o in line["ops"]} >= {"aten::linear", "aten::addmm", "kernel_addmm"}
    assert line["events"] and all(e["kind"] == "op" for e in line["events"])


def test_source_of_a_real_trace(client):
    files = get(client, "/api/p/cpu_mlp/source")["files"]
    assert files[0]["file"].endswith("record_trace.py") and files[0]["has_source"]
    f = get(client, f"/api/p/cpu_mlp/source/{files[0]['file_id']}")
    hot = max(f["lines"], key=lambda r: r["ops"])
    assert hot["ops"] > 0 and hot["code"].strip()
    ops = get(client, f"/api/p/cpu_mlp/source/{files[0]['file_id']}/lines/{hot['line']}")["ops"]
    assert any(o["name"].startswith("aten::") for o in ops)


def test_findings_are_the_analysis_findings(client, root):
    d = get(client, "/api/p/alexnet/findings")
    want = run_rules(Profile.open(root / "alexnet"))
    assert [f["title"] for f in d["findings"]] == [f.title for f in want]


def test_sql_runs_read_only_with_limits(client):
    d = get(client, "/api/p/base/sql?q=SELECT kind, count(*) AS n FROM events GROUP BY 1")
    assert d["result"]["columns"] == ["kind", "n"] and d["result"]["row_count"] > 1
    d = get(client, "/api/p/base/sql?q=SELECT * FROM events&limit=3")
    assert d["result"]["row_count"] == 3 and d["result"]["truncated"]
    for bad in ("SELECT * FROM read_csv('/etc/passwd')", "ATTACH '/tmp/x.db'",
                "COPY events TO '/tmp/x.csv'", "SELECT 1; SELECT 2", "SET threads = 1"):  # fmt: skip
        err = get(client, f"/api/p/base/sql?q={bad}", status=400)["error"]
        assert err.startswith("query:"), err
    csv = get(client, "/api/p/base/sql.csv?q=SELECT name FROM events ORDER BY id LIMIT 4")
    assert csv.text.splitlines()[0] == "name" and len(csv.text.splitlines()) == 5


def test_sql_time_limit(root):
    prof = Profile.open(root / "neuron")
    slow = "SELECT count(*) FROM events a, events b, events c WHERE a.id + b.id + c.id = 7"
    t0 = time.perf_counter()
    with pytest.raises(sql_view.QueryError, match="time limit"):
        sql_view.run_query(prof, slow, timeout_s=0.3)
    assert time.perf_counter() - t0 < 10


def test_tables_download_as_parquet(client, root):
    r = get(client, "/api/p/neuron/tables/events.parquet")
    assert pq.read_table(io.BytesIO(r.content)).num_rows == Profile.open(root / "neuron").row_count(
        "events"
    )
    get(client, "/api/p/neuron/tables/manifest.parquet", status=404)


def test_compare_sorts_by_largest_change(client):
    d = get(client, "/api/compare?a=base&b=test")
    deltas = [abs(r["delta"]) for r in d["ops"]]
    assert deltas == sorted(deltas, reverse=True) and deltas[0] > 0
    assert d["steps"]["a"]["count"] and d["breakdown"]
    get(client, "/api/compare?a=base&b=nope", status=404)


def test_pages_are_shells_with_their_script(client):
    for url, script in [("/", "profiles.js"), ("/p/neuron", "summary.js"),
                        ("/p/neuron/timeline", "timeline.js"), ("/p/neuron/operators", "operators.js"),
                        ("/p/neuron/source", "source.js"), ("/p/neuron/findings", "findings.js"),
                        ("/p/neuron/sql", "sql.js"), ("/compare?a=base&b=test", "compare.js")]:  # fmt: skip
        r = get(client, url)
        assert f"/static/js/{script}" in r.text
    assert get(client, "/static/plotly.min.js").content.startswith(b"/**")


@pytest.mark.parametrize(
    "url",
    ["/api/p/..", "/api/p/%2e%2e", "/api/p/..%2F..%2Fetc", "/api/p/%2Fetc%2Fpasswd", "/api/p/escape",
     "/p/escape", "/p/..%2Fescape", "/api/p/escape/tables/events.parquet", "/api/p/.hidden",
     "/api/p/neuron/source/..%2F..%2Fetc%2Fpasswd", "/api/p/neuron/source/0000deadbeef",
     "/api/p/neuron%2F..%2Fescape/timeline", "/api/compare?a=..&b=neuron"],
)  # fmt: skip
def test_urls_never_leave_the_served_directory(client, url):
    r = client.get(url)
    assert r.status_code == 404, (url, r.status_code)


def test_loopback_server_refuses_other_host_names(root, tmp_path):
    app = TestClient(create_app(root, ["127.0.0.1", "localhost"], analysis_cache=tmp_path))
    url = "/api/p/base/tables/stacks.parquet"
    assert app.get(url, headers={"Host": "127.0.0.1:8765"}).status_code == 200
    assert app.get(url, headers={"Host": "evil.example:8765"}).status_code == 400


def test_kept_sources_that_link_outside_are_not_read(root):
    prof = Profile.open(root / "neuron")
    assert source_view.read_source(prof, "/etc/secret.py") is None
    assert "fc1" in source_view.read_source(prof, "/home/user/project/train.py")


def test_html_from_traces_is_escaped(client):
    ops = {o["name"] for o in get(client, "/api/p/xss/operators")["operators"]}
    assert XSS_OP in ops  # kept as data...
    for url in ("/p/xss", "/p/xss/operators", "/p/xss/source", "/p/xss/timeline"):
        assert "<script>window" not in get(client, url).text  # ...and never put into HTML
    files = get(client, "/api/p/xss/source")["files"]
    assert files[0]["file"] == XSS_FILE
    r = client.get("/p/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert r.status_code == 404 and "<script>alert" not in r.text


def test_corrupt_profile_gives_an_error_and_the_server_goes_on(client):
    for url in ("/p/corrupt", "/p/corrupt/timeline"):
        r = client.get(url)
        assert r.status_code == 422 and "corrupt Parquet table" in r.text and "error-box" in r.text
    r = client.get("/api/p/corrupt/timeline")
    assert r.status_code == 422 and "corrupt" in r.json()["error"]
    assert get(client, "/api/p/base")["name"] == "base"
    assert get(client, "/p/base").status_code == 200


def test_requests_during_the_background_warm_up(root, tmp_path):
    # neuron_explorer.analysis keeps one DuckDB connection per profile; the app serialises its use
    import threading

    for i in range(3):  # a fresh analysis cache each time, so every warm-up computes
        app = create_app(root / "base", analysis_cache=tmp_path / str(i))
        warm = threading.Thread(target=app.state.warm_up)
        warm.start()
        assert TestClient(app).get("/api/profiles").status_code == 200
        warm.join()
    # the warm-up left the timeline's first view (whole profile, default width) computed: the
    # first visit's request is answered from it, and it is the view the route computes
    svc = app.state.service
    (name,) = svc.store.names()
    assert svc.store.has(name, f"timeline-all-{FIRST_VIEW_PX}")
    doc = get(TestClient(app), f"/api/p/{name}/timeline")
    idx = svc.index(name)
    s, e = timeline.first_view(idx)
    fresh = timeline.window(Profile.open(svc.store.path(name)), idx, s, e, FIRST_VIEW_PX)
    assert doc["window"] == json.loads(json.dumps(fresh.to_dict())) and doc["window"]["events"] > 0


def _serve(args, env):
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_explorer", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    line = proc.stdout.readline()
    return proc, line


@pytest.mark.sweep  # ~15 s quiet; test_web_fence serves a raw trace in the default run
def test_serve_imports_a_raw_trace_and_warns_off_loopback(tmp_path, root):
    import httpx

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc, line = _serve([str(BASE_TRACE), "--host", "0.0.0.0"], env)
    try:
        assert "serving" in line and "http://0.0.0.0:" in line, line
        url = line.split(" at ")[1].split()[0]
        port = url.split(":")[2].split("/")[0]
        r = httpx.get(f"http://127.0.0.1:{port}/api/profiles", timeout=120)
        assert r.status_code == 200, r.text
        assert [p["name"] for p in r.json()["profiles"]] == ["trace_compare_base_base"]
        assert list((tmp_path / "cache" / "neuron-explorer").glob("*/trace_compare_base_base"))
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "warning: serving on 0.0.0.0" in err, err


def test_serve_rejects_a_missing_path(tmp_path):
    r = subprocess.run([sys.executable, "-m", "neuron_explorer", "serve", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_serve_reports_a_port_in_use(root):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "neuron_explorer", "serve", str(root / "base"),
                            "--port", str(port)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr


DOC_NAMES = {"{name}": "NAME", "{event_id}": "ID", "{file_id}": "FILE_ID", "{line}": "N",
             "{table}": "TABLE"}  # fmt: skip


def test_every_route_is_in_docs_web_md(client):
    """docs/web.md names every route the app serves (page, JSON twin, download)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "web.md").read_text()
    paths = [r.path for r in client.app.routes if getattr(r, "methods", None)]
    assert len(paths) > 15
    missing = []
    for path in paths:
        doc = re.sub(r"\{\w+\}", lambda m: DOC_NAMES[m.group(0)], path)
        if path.startswith("/static/"):
            continue
        if not re.search(r"`" + re.escape(doc) + r"[`?#]", text):
            missing.append(doc)
    assert missing == [], missing


@pytest.mark.parametrize(("name", "q", "regex"), [("neuron", "mm", False), ("neuron", "^aten::(add|mul)", True),
                                                  ("alexnet", "CONV", False), ("gpt", "matmul|linear", True)])  # fmt: skip
def test_search_finds_every_event_by_name(client, name, q, regex):
    """The timeline's find: the total equals a count in plain SQL, the matches come first in
    time order, and the names listed are exactly the distinct names matched."""
    con = client.app.state.store.connection(name)
    pred = (
        "regexp_matches(CAST(name AS VARCHAR), ?)"
        if regex
        else "CAST(name AS VARCHAR) ILIKE '%' || ? || '%'"
    )
    want = con.execute(
        f"SELECT count(*), count(DISTINCT name) FROM events WHERE {pred}", [q]
    ).fetchone()
    d = get(client, f"/api/p/{name}/search?q={q}&regex={str(regex).lower()}&limit=50")
    assert want[0] > 0 and d["total"] == want[0] and len(d["names"]) == want[1]
    starts = [m["start_ns"] for m in d["matches"]]
    assert len(starts) == min(50, want[0]) and starts == sorted(starts)
    first = con.execute(f"SELECT min(start_ns) FROM events WHERE {pred}", [q]).fetchone()[0]
    assert starts[0] == first and d["truncated"] == (want[0] > 50)


def test_search_refuses_bad_patterns(client):
    r = client.get("/api/p/neuron/search", params={"q": "(", "regex": "true"})
    assert r.status_code == 400 and r.json()["error"].startswith("search:")
    r = client.get("/api/p/neuron/search", params={"q": "x" * 501})
    assert r.status_code == 400 and "longer than the limit" in r.json()["error"]
    assert get(client, "/api/p/neuron/search?q=no-such-name-anywhere")["total"] == 0
    # RE2: a pattern that backtracks exponentially elsewhere is linear here
    t0 = time.monotonic()
    get(client, "/api/p/neuron/search?q=(a%2B)%2B%24&regex=true")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("name", ["gpt", "cpu_mlp", "neuron"])
def test_memory_peak_and_what_was_held_there(client, name):
    """The memory page's model against plain SQL over the counters: each counter's peak, a
    chart that keeps it (bucket maxima), and the growth to the peak charged to ops and lines
    that add up to it exactly."""
    con = client.app.state.store.connection(name)
    want = con.execute("SELECT CAST(track AS VARCHAR), max(value), count(*) FROM counters "
                       "WHERE name = 'memory_allocated' GROUP BY 1 "
                       "ORDER BY CAST(track AS VARCHAR) = 'cpu', 2 DESC").fetchall()  # fmt: skip
    d = get(client, f"/api/p/{name}/memory")
    alloc = [c for c in d["counters"] if c["name"] == "memory_allocated"]
    assert {(c["track"], c["peak"], c["samples"]) for c in alloc} == set(want)
    for c in d["counters"]:
        assert len(c["ts_ns"]) <= 2000 and max(c["max"]) == c["peak"]
        assert all(lo <= hi for lo, hi in zip(c["min"], c["max"], strict=True))
    pk = d["peak"]
    assert (pk["track"], pk["value"]) == want[0][:2]
    series = con.execute("SELECT ts_ns, value FROM counters WHERE name = 'memory_allocated' "
                         "AND track = ?", [pk["track"]]).fetchall()  # fmt: skip
    before = [v for t, v in series if pk["since_ns"] is not None and t < pk["since_ns"]]
    # with no sample before the step, the first sample's value was held before it
    assert pk["baseline"] == (before[-1] if before else series[0][1])
    assert pk["growth"] == pk["value"] - pk["baseline"]
    assert 0 <= pk["baseline_held"] <= pk["baseline"]
    # the holdings and the baseline still held add up to the peak; nothing holds more than
    # it allocated, nor less than nothing
    if len(pk["by_op"]) < 25:
        assert sum(r["held_bytes"] for r in pk["by_op"]) == pytest.approx(pk["charged"])
    assert pk["charged"] == pytest.approx(pk["value"] - pk["baseline_held"])
    for r in pk["by_op"] + pk["by_line"] + pk["by_module"]:
        assert -1e-6 <= r["held_bytes"] <= r["allocated_bytes"] + 1e-6, r
    assert sum(r["held_bytes"] for r in pk["by_line"]) <= pk["value"]
    assert pk["by_op"] and pk["by_op"][0]["held_bytes"] > 0
    assert all(r["file_id"] for r in pk["by_line"])


def test_memory_of_a_profile_without_counters_and_counter_windows(client):
    d = get(client, "/api/p/alexnet/memory")
    assert d["counters"] == [] and d["peak"] is None
    full = get(client, "/api/p/gpt/memory")["counters"][0]
    mid = full["ts_ns"][len(full["ts_ns"]) // 2]
    win = get(client, f"/api/p/gpt/counters?start_ns={mid}&end_ns={mid + 2_000_000}&width_px=100")[
        "counters"
    ][0]
    assert len(win["ts_ns"]) <= 100 and all(mid <= t <= mid + 2_000_000 for t in win["ts_ns"])
    get(client, "/api/p/gpt/counters?start_ns=0", status=422)


CAPTURE_MLP = """
import sys, torch, neuron_explorer
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("neuron")
# activations far larger than the parameters, and no foreach temporaries in the optimizer, so
# the peak is held by the modules' forward and backward work (not by optimizer temporaries)
opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
x = torch.randn(512, 64).to("neuron")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                            schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
                            on_trace_ready=neuron_explorer.trace_handler(sys.argv[1])) as prof:
    for _ in range(3):
        model(x).sum().backward(); opt.step(); opt.zero_grad(); prof.step()
"""


@pytest.mark.slow
def test_memory_at_the_peak_by_module_of_a_real_capture(tmp_path):
    """A tiny MLP captured on the neuron device: the memory held at the peak is also split by
    nn.Module path, and each module named is one the events carry."""
    out = tmp_path / "root" / "mlp"
    subprocess.run(
        [sys.executable, "-c", CAPTURE_MLP, str(out)], check=True, capture_output=True, timeout=600
    )
    client = TestClient(create_app(out.parent, analysis_cache=tmp_path / "cache"))
    pk = get(client, "/api/p/mlp/memory")["peak"]
    con = client.app.state.store.connection("mlp")
    modules = {r[0] or "(model)" for r in con.execute("SELECT DISTINCT CAST(module AS VARCHAR) FROM events "
                                                      "WHERE module IS NOT NULL").fetchall()}  # fmt: skip
    assert pk["track"] == "neuron:0" and pk["by_module"], json.dumps(pk)[:1500]
    assert {m["module"] for m in pk["by_module"]} <= modules
    # every rise is charged once: the op shares add up to what the step's ops still hold;
    # allocations are op outputs, so nothing grows outside an op
    by_op = {o["op"]: o for o in pk["by_op"]}
    assert abs(sum(o["held_bytes"] for o in by_op.values()) - pk["charged"]) <= 1
    outside = by_op.get("(outside any op)", {"held_bytes": 0, "allocations": 0})
    assert outside["allocations"] == 0, json.dumps(pk)[:1500]
    # the modules' shares are those of the ops that ran in one: no more than the ops got
    assert (
        sum(m["held_bytes"] for m in pk["by_module"]) <= pk["charged"] - outside["held_bytes"] + 1
    )


@pytest.mark.parametrize("name", ["neuron", "alexnet"])
def test_span_totals_clip_every_event_to_the_span(client, name):
    """Range selection: the events overlapping a span, each counted for its time inside it,
    against the same sums done in Python over the events table."""
    con = client.app.state.store.connection(name)
    lo, hi = con.execute("SELECT min(start_ns), max(start_ns + dur_ns) FROM events").fetchone()
    s, e = lo + (hi - lo) // 3, lo + (hi - lo) // 2
    rows = con.execute(
        "SELECT CAST(layer AS VARCHAR), CAST(kind AS VARCHAR), start_ns, dur_ns FROM events"
    ).fetchall()
    want: dict[tuple[str, str], list[int]] = {}
    for layer, kind, st, du in rows:
        if (st < e and st + du > s) or (du == 0 and s <= st < e):
            acc = want.setdefault((layer, kind), [0, 0])
            acc[0] += 1
            acc[1] += min(st + du, e) - max(st, s)
    d = get(client, f"/api/p/{name}/span?start_ns={s}&end_ns={e}")
    got = {(k["layer"], k["kind"]): [k["count"], k["time_ns"]] for k in d["by_kind"]}
    assert got == want and d["events"] == sum(c for c, _ in want.values()) > 0
    assert d["dur_ns"] == e - s and all(0 < ln["busy"] <= 1.0 + 1e-9 for ln in d["lanes"])
    if name == "neuron":
        assert d["ops"] and d["kernels"] and {ln["track"] for ln in d["lanes"]} >= {"TensorE"}
    get(client, f"/api/p/{name}/span?start_ns={s}", status=422)


def test_strays_far_from_the_rest_do_not_empty_the_whole_view(client, root, tmp_path):
    """A copy of a real profile with two events at 9e18 ns (their ends overflow int64): the
    first view fits the other events and says how many lie outside; the list, the summary
    page and windows still answer."""
    from test_web_security import far_events

    far_events(root / "base", tmp_path / "p" / "far")
    c = TestClient(create_app(tmp_path / "p", analysis_cache=tmp_path / "cache"))
    d = get(c, "/api/p/far/timeline?width_px=1000")
    good = get(client, "/api/p/base/timeline?width_px=1000")
    assert d["extent"]["end_ns"] > 9 * 10**18 and good["fit"] is None
    assert d["fit"]["outside_events"] == 2 and d["fit"]["end_ns"] < 10**12
    assert (
        d["window"]["start_ns"] == d["fit"]["start_ns"]
        and d["window"]["end_ns"] == d["fit"]["end_ns"]
    )
    assert d["window"]["events"] == good["window"]["events"] - 2
    assert c.get("/api/profiles").status_code == 200 and c.get("/p/far").status_code == 200
    last = get(c, f"/api/p/far/timeline?start_ns={d['fit']['end_ns']}&end_ns={2**62}&width_px=500")
    assert last["window"]["events"] >= 0  # a window out to the URL limit answers, no overflow
    get(c, f"/api/p/far/timeline?start_ns={9 * 10**18}&end_ns={9 * 10**18 + 10**6}", status=422)


def test_compare_kernels_and_findings(client):
    """Compare, kernel level: each kernel's time and launches on both sides, against SQL, the
    largest change first; findings matched by rule into appeared, went and both."""
    d = get(client, "/api/compare?a=base&b=test")
    sums = {}
    for side in ("base", "test"):
        con = client.app.state.store.connection(side)
        sums[side] = {n: (c, t) for n, c, t in con.execute(
            "SELECT CAST(name AS VARCHAR), count(*), sum(dur_ns) FROM events WHERE kind = 'gpu_kernel' GROUP BY 1").fetchall()}  # fmt: skip
    assert {r["name"] for r in d["kernels"]} == set(sums["base"]) | set(sums["test"])
    for r in d["kernels"]:
        for side, key in (("a", "base"), ("b", "test")):
            if r["name"] in sums[key]:
                assert (r[side]["count"], r[side]["time_ns"]) == sums[key][r["name"]]
    deltas = [abs(r["delta"]) for r in d["kernels"]]
    assert deltas == sorted(deltas, reverse=True)
    f = d["findings"]
    rules = {
        side: {x["rule"] for x in get(client, f"/api/p/{side}/findings")["findings"]}
        for side in ("base", "test")
    }
    assert f["available"]
    assert {x["rule"] for x in f["appeared"]} == rules["test"] - rules["base"]
    assert {x["rule"] for x in f["went"]} == rules["base"] - rules["test"]
    assert {x["rule"] for x in f["both"]} == rules["base"] & rules["test"]

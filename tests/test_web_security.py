"""The holes of issue 17, each against the real server (`neuron-explorer serve`, uvicorn on
127.0.0.1) unless it is about one function: SQL bounded for the whole server (running, queued,
memory, answer size) with pages and static files served while it is saturated; no DuckDB spills
and no temp folder SQL can read; cross-site API requests refused; CSP, nosniff and frame headers;
no CDN docs page; HEAD; idle connections closed; a malformed, unreadable or hung profile costs
only its own row; SIGTERM always stops the server; validation errors are one sentence."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_web_support import synth_module

from neuron_explorer.web import guard
from neuron_explorer.web.listing import ProfileList
from neuron_explorer.web.views import sql as sql_view

ROOT = Path(__file__).resolve().parents[1]
FOREVER_SQL = "SELECT count(*) FROM events a, events b, events c WHERE a.id + b.id + c.id = -1"
# a full sort of 200M rows (a window over all of them): GBs unless stopped by the memory limit
HEAVY_SQL = (
    "SELECT max(r) FROM (SELECT row_number() OVER (ORDER BY hash(x)) r FROM range(100000000) t(x))"
)


@contextmanager
def serve(root: Path, cwd: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m neuron_explorer serve ROOT --port 0` run in `cwd`; yields (base URL, process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cwd / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "serve", str(root), "--port", "0"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert " at http://" in line, line + proc.stderr.read()
        yield line.split(" at ")[1].split()[0].split("/p/")[0].rstrip("/"), proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture(scope="module")
def neuron_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sec") / "profiles"
    root.mkdir()
    synth_module().make_profile(root / "neuron", 20_000)
    return root


@pytest.mark.sweep  # ~16 s of runaway queries
def test_sql_is_bounded_for_the_whole_server(neuron_root, tmp_path):
    """A flood of runaway queries: RUNNING run, QUEUED wait, the rest get 503 at once; pages,
    static files and the profile list stay fast; three memory-heavy queries fail on the memory
    limit instead of growing the server by gigabytes (no spill to disk either); one answer is
    cut at MAX_RESULT_BYTES; `.tmp` in the server's directory cannot be read through SQL."""
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "spill.txt").write_text("LEAKED")
    with serve(neuron_root, tmp_path) as (base, proc), httpx.Client(timeout=120) as c:
        r = c.get(
            f"{base}/api/p/neuron/sql", params={"q": "SELECT * FROM read_text('.tmp/spill.txt')"}
        )
        assert r.status_code == 400 and "LEAKED" not in r.text, r.text
        big = c.get(f"{base}/api/p/neuron/sql", params={"q": "SELECT repeat('x', 10000) AS s FROM range(10000)",
                                                        "limit": 10_000})  # fmt: skip
        res = big.json()["result"]
        assert res["truncated"] and res["cut_at_bytes"] == sql_view.MAX_RESULT_BYTES
        assert 1000 < res["row_count"] < 1700 and len(big.content) < 1.2 * sql_view.MAX_RESULT_BYTES

        heavy: list[tuple[int, str]] = []
        ts = [
            threading.Thread(target=lambda: heavy.append(_sql(base, HEAVY_SQL))) for _ in range(3)
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=120)
        assert [s for s, _ in heavy] == [400] * 3 and all(
            "Out of Memory" in e or "time limit" in e or "MB of memory" in e for _, e in heavy
        ), heavy
        rss = peak_rss_mb(proc.pid)
        assert rss < 2.5 * 1024, f"server grew to {rss:.0f} MB"
        assert not any((tmp_path / ".tmp").glob("duckdb*")), "a query spilled to disk"

        flood: list[tuple[int, str]] = []
        n = sql_view.RUNNING + sql_view.QUEUED + 4
        ts = [
            threading.Thread(target=lambda: flood.append(_sql(base, FOREVER_SQL))) for _ in range(n)
        ]
        for t in ts:
            t.start()
        time.sleep(1.0)  # all admitted or refused by now
        served = {}
        for url in ("/static/app.css", "/static/plotly.min.js", "/", "/p/neuron", "/api/profiles",
                    "/api/p/neuron/timeline"):  # fmt: skip
            t0 = time.monotonic()
            status = c.get(f"{base}{url}").status_code
            served[url] = (status, time.monotonic() - t0)
        refused = [e for s, e in flood if s == 503]
        assert len(refused) == 4 and all("try again" in e for e in refused), flood
        assert all(s == 200 and took < 3.0 for s, took in served.values()), served
        proc.send_signal(signal.SIGTERM)  # with 8 queries still running or queued
        t0 = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 10
    print(
        f"\nheavy SQL peak RSS {rss:.0f} MB; while {n} runaway queries: "
        + ", ".join(f"{u} {took * 1e3:.0f} ms" for u, (_, took) in served.items())
    )


def _sql(base: str, q: str) -> tuple[int, str]:
    try:
        r = httpx.get(f"{base}/api/p/neuron/sql", params={"q": q}, timeout=120)
    except httpx.HTTPError as e:  # the server was stopped under it
        return 0, str(e)
    try:
        return r.status_code, r.json().get("error", "")
    except ValueError:  # uvicorn's own plain-text answer while it shuts down
        return r.status_code, r.text


CROSS = [
    ({"Sec-Fetch-Site": "cross-site"}, 403), ({"Sec-Fetch-Site": "same-site"}, 403),
    ({"Origin": "http://evil.example"}, 403), ({"Origin": "null"}, 403),
    ({"Sec-Fetch-Site": "same-origin"}, 200), ({"Sec-Fetch-Site": "none"}, 200), ({}, 200),
]  # fmt: skip


def test_headers_cross_site_head_no_cdn_and_validation(neuron_root, tmp_path):
    with serve(neuron_root, tmp_path) as (base, _), httpx.Client(timeout=60) as c:
        for headers, status in CROSS:
            for url in ("/api/profiles", "/api/p/neuron/sql?q=SELECT%201"):
                r = c.get(f"{base}{url}", headers=headers)
                assert r.status_code == status, (headers, url, r.status_code)
                if status == 403:
                    assert "cross-site request refused" in r.json()["error"]
        own = base.replace("http://", "")
        assert c.get(f"{base}/api/profiles", headers={"Origin": f"http://{own}"}).status_code == 200
        # a link from elsewhere still opens the page (a shell without data)
        assert (
            c.get(f"{base}/p/neuron", headers={"Sec-Fetch-Site": "cross-site"}).status_code == 200
        )
        for url in ("/", "/p/neuron/timeline", "/api/p/neuron", "/static/app.css", "/nothing"):
            r = c.get(f"{base}{url}")
            csp = r.headers.get("content-security-policy", "")
            assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp, url
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["x-frame-options"] == "DENY"
        assert c.get(f"{base}/api/docs").status_code == 404
        assert c.get(f"{base}/redoc").status_code == 404
        assert "paths" in c.get(f"{base}/api/openapi.json").json()
        for url in (
            "/",
            "/p/neuron",
            "/api/profiles",
            "/api/p/neuron/operators",
            "/static/app.css",
        ):
            get, head = c.get(f"{base}{url}"), c.head(f"{base}{url}")
            assert head.status_code == 200 and head.content == b"", url
            assert head.headers["content-type"] == get.headers["content-type"]
        assert c.head(f"{base}/p/nothing").status_code == 404
        # validation errors are one sentence (the page shows `error`), not FastAPI's list
        r = c.get(f"{base}/api/p/neuron/timeline", params={"start_ns": "soon"})
        assert r.status_code == 422 and r.json()["error"].startswith("start_ns: ")
        r = c.get(f"{base}/api/compare", params={"a": "neuron"})
        assert r.status_code == 422 and r.json()["error"] == "b: Field required"


def test_idle_connections_are_closed(neuron_root, monkeypatch):
    """Real uvicorn on 127.0.0.1 with the server's protocol and a 1 s deadline: sockets that
    send nothing, or drip half a request, are closed; a kept-alive client is served again."""
    import uvicorn

    from neuron_explorer.web.app import create_app

    monkeypatch.setattr(guard, "IDLE_S", 1.0)
    srv = uvicorn.Server(uvicorn.Config(create_app(neuron_root), host="127.0.0.1", port=0,
                                        log_level="warning", http=guard.IdleTimeoutProtocol))  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv.config.port = port
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        drip = socket.create_connection(("127.0.0.1", port))
        drip.sendall(b"GET /api/profiles HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            assert c.get("/api/profiles").status_code == 200
            time.sleep(0.5)  # well within the deadline
            assert c.get("/static/app.css").status_code == 200
            time.sleep(2.0)
            for s in (*idle, drip):
                s.settimeout(5)
                assert s.recv(100) == b""  # closed by the server
                s.close()
            assert len(srv.server_state.connections) <= 1
            assert c.get("/api/profiles").status_code == 200  # reconnects
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


def far_events(src: Path, dst: Path) -> Path:
    """A copy of a real profile whose last two events sit at 9e18 ns, so their ends overflow
    int64 in any query that adds start and duration."""
    shutil.copytree(src, dst)
    f = dst / "events.parquet"
    t = pq.read_table(f)
    start, dur = t["start_ns"].to_pylist(), t["dur_ns"].to_pylist()
    start[-2:], dur[-2:] = [9 * 10**18, 9 * 10**18 + 5], [4 * 10**17, 9 * 10**17]
    t = t.set_column(t.schema.get_field_index("start_ns"), "start_ns", pa.array(start, pa.int64()))
    t = t.set_column(t.schema.get_field_index("dur_ns"), "dur_ns", pa.array(dur, pa.int64()))
    pq.write_table(t.replace_schema_metadata(pq.read_metadata(f).metadata), f, compression="zstd")
    return dst


ODD_NAMES = ["with space", "ünïcödé-名前", "-leading-dash", "x" * 210, "quote's+plus"]


def test_bad_profiles_cost_their_own_row(tmp_path, imported_profiles):
    root = tmp_path / "profiles"
    root.mkdir()
    good = imported_profiles["compare_base"]
    for name in ODD_NAMES:
        shutil.copytree(good, root / name)
    far_events(good, root / "far")
    shutil.copytree(good, root / "pipe")
    (root / "pipe" / "events.parquet").unlink()
    os.mkfifo(root / "pipe" / "events.parquet")
    shutil.copytree(good, root / ".hidden")
    shutil.copytree(good, tmp_path / "outside")
    os.symlink(tmp_path / "outside", root / "link-out")
    os.symlink(root / "with space", root / "link-in")
    with serve(root, tmp_path) as (base, proc), httpx.Client(timeout=60) as c:
        t0 = time.monotonic()
        d = c.get(f"{base}/api/profiles").json()
        took = time.monotonic() - t0
        rows = {r["name"]: r for r in d["profiles"]}
        assert set(rows) == {*ODD_NAMES, "far", "pipe", "link-in"}
        assert "not a regular file" in rows["pipe"]["error"]
        for name in (*ODD_NAMES, "link-in"):
            assert rows[name]["error"] is None and rows[name]["events"] > 0, rows[name]
            q = quote(name, safe="")
            for url in (f"/p/{q}", f"/api/p/{q}", f"/api/p/{q}/tables/events.parquet"):
                assert c.get(base + url).status_code == 200, url
        skipped = {s["name"]: s["reason"] for s in d["skipped"]}
        assert set(skipped) == {".hidden", "link-out"}
        assert "hidden" in skipped[".hidden"] and "outside" in skipped["link-out"]
        assert c.get(f"{base}/api/p/link-out").status_code == 404
        assert c.get(f"{base}/api/p/.hidden").status_code == 404
        assert took < 30
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_a_hung_profile_costs_only_its_row(tmp_path):
    """A row whose reading blocks (a real named pipe nobody writes) is reported after the time
    bound, the others are listed, and asking again does not start a second reader."""
    fifo = tmp_path / "events.parquet"
    os.mkfifo(fifo)
    started = []

    def make_row(name: str) -> dict:
        if name == "hung":
            started.append(name)
            fifo.read_bytes()  # blocks until a writer opens the pipe
        return {"name": name, "error": None}

    listing = ProfileList()
    t0 = time.monotonic()
    rows = listing.rows(["a", "hung", "b"], make_row, row_s=0.5)
    assert time.monotonic() - t0 < 3
    assert [r["name"] for r in rows] == ["a", "hung", "b"]
    # a row not read yet is still being read (a slow profile is only slow), not an error
    assert rows[0]["error"] is None and rows[1]["error"] is None and rows[1]["reading_s"] >= 0.5
    assert listing.rows(["hung"], make_row, row_s=0.2)[0]["reading_s"] >= rows[1]["reading_s"]
    assert started == ["hung"]
    with open(fifo, "wb"):  # release the reader
        pass

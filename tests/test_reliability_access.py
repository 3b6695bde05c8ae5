"""Access, in one place: URLs never reach outside the served directory (.., absolute paths,
encoded slashes, symlinks), SQL is sandboxed (no file read, write or attach; a time limit; a
row limit; a size limit), HTML from traces is escaped, the Host header is checked on loopback,
the server binds 127.0.0.1 by default and warns elsewhere, and oversized requests are refused."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from test_web_support import XSS_FILE, XSS_OP, synth_module, xss_trace

from neuron_explorer.entry import build_parser
from neuron_explorer.importers import import_traces
from neuron_explorer.model import Profile
from neuron_explorer.web.app import create_app
from neuron_explorer.web.views import source as source_view
from neuron_explorer.web.views import sql as sql_view

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def root(tmp_path_factory, imported_profiles):
    """neuron (synthetic), base (a real trace), xss (HTML in names and paths), a symlink
    `escape` to a profile outside, and a kept source that links to a file outside."""
    tmp = tmp_path_factory.mktemp("access")
    root = tmp / "profiles"
    root.mkdir()
    synth_module().make_profile(root / "neuron", 3000)
    shutil.copytree(imported_profiles["compare_base"], root / "base")
    import_traces([xss_trace(tmp / "xss.json")], root / "xss")
    shutil.copytree(imported_profiles["compare_base"], tmp / "outside")
    os.symlink(tmp / "outside", root / "escape")
    (tmp / "secret.py").write_text("SECRET = 1\n")
    kept = root / "neuron" / "sources" / "etc"
    kept.mkdir(parents=True)
    os.symlink(tmp / "secret.py", kept / "secret.py")
    return root


@pytest.fixture(scope="module")
def client(root):
    return TestClient(create_app(root))


TRAVERSALS = [
    "/api/p/..", "/api/p/%2e%2e", "/api/p/%252e%252e", "/api/p/..%2F..%2Fetc", "/api/p/..%5c..%5cetc",
    "/api/p/%2Fetc%2Fpasswd", "/api/p//etc/passwd", "/p/%2Fetc", "/api/p/escape", "/p/escape",
    "/api/p/escape/tables/events.parquet", "/api/p/.hidden", "/api/p/neuron%2F..%2Fescape/timeline",
    "/api/p/neuron/source/..%2F..%2Fetc%2Fpasswd", "/api/p/neuron/source/%2Fetc%2Fpasswd",
    "/api/p/neuron/tables/..%2Fmanifest.parquet", "/api/p/neuron/tables/%2Fetc%2Fpasswd.parquet",
    "/api/compare?a=..&b=neuron", "/api/compare?a=escape&b=neuron", "/static/..%2F..%2Fapp.py",
    "/static/%2e%2e/%2e%2e/app.py",
]  # fmt: skip


@pytest.mark.parametrize("url", TRAVERSALS)
def test_urls_never_leave_the_served_directory(client, url):
    r = client.get(url)
    assert r.status_code == 404, (url, r.status_code)
    assert "SECRET" not in r.text and "root:" not in r.text


def test_symlinks_out_are_neither_listed_nor_read(client, root):
    names = {p["name"] for p in client.get("/api/profiles").json()["profiles"]}
    assert names == {"neuron", "base", "xss"}
    prof = Profile.open(root / "neuron")
    assert source_view.read_source(prof, "/etc/secret.py") is None


SANDBOX = [
    "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/*')", "SELECT * FROM read_parquet('{root}/base/events.parquet')",
    "ATTACH '/tmp/x.db' AS x", "COPY events TO '/tmp/out.csv'", "INSTALL httpfs", "LOAD httpfs",
    "SET enable_external_access = true", "PRAGMA enable_profiling", "SELECT 1; SELECT 2",
    "CREATE TABLE t AS SELECT 1", "EXPORT DATABASE '/tmp/db'",
]  # fmt: skip


@pytest.mark.parametrize("q", SANDBOX)
def test_sql_cannot_touch_files_or_settings(client, root, q):
    r = client.get("/api/p/neuron/sql", params={"q": q.format(root=root)})
    assert r.status_code == 400 and r.json()["error"].startswith("query:"), (q, r.text[:300])
    assert not Path("/tmp/x.db").exists() and not Path("/tmp/out.csv").exists()


def test_sql_row_time_and_size_limits(client, root):
    d = client.get(
        "/api/p/neuron/sql", params={"q": "SELECT * FROM range(50000)", "limit": 10**12}
    ).json()
    assert d["result"]["row_count"] == sql_view.MAX_ROWS and d["result"]["truncated"]
    d = client.get("/api/p/neuron/sql", params={"q": "SELECT * FROM range(50)", "limit": -5}).json()
    assert d["result"]["row_count"] == 1
    slow = "SELECT count(*) FROM events a, events b, events c WHERE a.id + b.id + c.id = -1"
    t0 = time.monotonic()
    with pytest.raises(sql_view.QueryError, match="time limit"):
        sql_view.run_query(Profile.open(root / "neuron"), slow, timeout_s=0.3)
    assert time.monotonic() - t0 < 10
    long_sql = "SELECT 1 AS x" + " " * sql_view.MAX_SQL_CHARS
    r = client.get("/api/p/neuron/sql", params={"q": long_sql})
    assert r.status_code == 400 and "longer than the limit" in r.json()["error"]


def test_out_of_range_numbers_in_urls_are_refused(client):
    r = client.get("/api/p/neuron/timeline", params={"start_ns": 10**23, "end_ns": -5})
    assert r.status_code == 422
    assert client.get("/api/p/neuron/events/99999999999999999999999").status_code == 404
    assert client.get("/api/p/neuron/timeline", params={"width_px": 10**20}).status_code == 200


def test_html_from_traces_is_escaped(client):
    ops = {o["name"] for o in client.get("/api/p/xss/operators").json()["operators"]}
    assert XSS_OP in ops  # kept as data, as JSON...
    assert client.get("/api/p/xss/source").json()["files"][0]["file"] == XSS_FILE
    for url in ("/p/xss", "/p/xss/operators", "/p/xss/source", "/p/xss/timeline", "/p/xss/sql"):
        assert "<script>window" not in client.get(url).text  # ...never put into HTML
    r = client.get("/p/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert r.status_code == 404 and "<script>alert" not in r.text
    r = client.get("/p/xss/source/%3Cscript%3Ealert(2)%3C%2Fscript%3E")
    assert "<script>alert(2)" not in r.text


def test_host_header_is_checked_on_loopback(root):
    app = TestClient(create_app(root, allowed_hosts=["127.0.0.1", "localhost"]))
    assert app.get("/api/profiles", headers={"Host": "127.0.0.1:8765"}).status_code == 200
    assert app.get("/api/profiles", headers={"Host": "attacker.example"}).status_code == 400


def test_default_bind_is_loopback():
    args = build_parser().parse_args(["serve", "somewhere"])
    assert args.host == "127.0.0.1"


def test_off_loopback_warns_and_oversized_requests_are_refused(root):
    """The real server: a warning when bound beyond loopback; a huge URL, huge headers and
    large bodies are refused (nothing accepts a body) and the server goes on."""
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "serve", str(root), "--host", "0.0.0.0",
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        port = int(line.split(" at ")[1].split(":")[2].split("/")[0])
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=60) as c:
            r = c.get(f"{base}/api/p/neuron/sql?q=SELECT%20{'1' * 60_000}")
            assert r.status_code == 400 and "longer than the limit" in r.json()["error"]
            # a megabyte of headers, 50 MB of body where nothing accepts a body: refused with a
            # 4xx, or the connection reset before the server reads it all
            for method, url, kw in [
                ("GET", "/api/profiles", {"headers": {"X-Big": "a" * (1 << 20)}}),
                ("POST", "/api/p/neuron/sql", {"content": b"x" * (50 << 20)}),
                ("PUT", "/api/p/neuron", {"content": b"x" * (1 << 20)}),
            ]:
                try:
                    status = c.request(method, f"{base}{url}", **kw).status_code
                except httpx.HTTPError:
                    status = 400
                assert 400 <= status < 500, (method, url, status)
                assert c.get(f"{base}/api/p/neuron").status_code == 200
        with socket.create_connection(("127.0.0.1", port)) as s:  # a body announced, never sent
            s.sendall(b"POST /api/p/neuron/sql HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Length: 999999999\r\n\r\n")  # fmt: skip
            assert s.recv(100).startswith(b"HTTP/1.1 405")
        assert httpx.get(f"{base}/api/profiles", timeout=60).status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "warning: serving on 0.0.0.0" in err, err

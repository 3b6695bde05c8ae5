"""Issue 29, a server that stays up and stays inside: each hole against the real server
(`neuron-explorer serve`, uvicorn on 127.0.0.1) and the MCP server over the same hostile
profiles, made by tests/hostile_paths.py. A line number of 2**31 - 1 lists only the file's own
lines; nothing a profile names is read through a link out of its folder (sources/ itself a
link to / or elsewhere, tables, a dataset folder, the manifest); a raw trace keeps Python files
from its own folder only, unless the user names more; no answer names the server user's home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hostile_paths import HUGE_LINE, RAW_HUGE_LINE, TOKEN, TOKEN_ENV, TRAIN_PY, Hostile, make
from test_web_security import peak_rss_mb

ROOT = Path(__file__).resolve().parents[1]
PASSWD = "root:x:0:0"  # the first line of /etc/passwd
LINKED_OUT = ("events-out", "events-dir-out", "stacks-out", "counters-out", "manifest-out")
SERVER_MB = 1500  # the listing that ran to 2**31 - 1 lines took 23 GB before the kernel killed it


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Hostile:
    return make(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def server_home(tmp_path_factory) -> Path:
    """The server's HOME: a folder whose name no answer may carry."""
    return tmp_path_factory.mktemp("home-of-the-server-user-q7x")


def _env(cwd: Path, home: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cwd / "cache"),
            "HOME": str(home), TOKEN_ENV: TOKEN}  # fmt: skip


@contextmanager
def serve(path: Path, cwd: Path, home: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m neuron_explorer serve PATH --port 0 ARGS` with TOKEN in its environment."""
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "serve", str(path), "--port", "0", *args],
                            cwd=cwd, env=_env(cwd, home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert " at http://" in line, line + proc.stderr.read()
        yield line.split(" at ")[1].split()[0].split("/p/")[0].rstrip("/"), proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(hostile, server_home, tmp_path_factory) -> Iterator[tuple[str, subprocess.Popen]]:
    with serve(hostile.served, tmp_path_factory.mktemp("cwd"), server_home) as s:
        yield s


def _source_urls(c: httpx.Client, base: str, name: str) -> list[str]:
    doc = c.get(f"{base}/api/p/{quote(name)}/source").json()
    fids = {f["file_id"] for f in doc.get("files", []) + doc.get("model_files", [])}
    return [f"/api/p/{quote(name)}/source/{fid}{tail}" for fid in sorted(fids)
            for tail in ("", "?around=1", "/lines/1")]  # fmt: skip


def _every_answer(c: httpx.Client, base: str, name: str) -> dict[str, httpx.Response]:
    """Every API route of one profile (and its pages), as a visitor would ask them."""
    n = quote(name)
    urls = [f"/api/p/{n}", f"/p/{n}", f"/api/p/{n}/operators", f"/api/p/{n}/timeline",
            f"/api/p/{n}/memory", f"/api/p/{n}/findings", f"/api/p/{n}/calltree",
            f"/api/p/{n}/modules", f"/api/p/{n}/counters?start_ns=0&end_ns=10000000000",
            f"/api/p/{n}/search?q=aten", f"/api/p/{n}/events/0", f"/api/p/{n}/source",
            *(f"/api/p/{n}/sql?q={quote('SELECT * FROM ' + t)}" for t in ("events", "stacks", "counters")),
            *(f"/api/p/{n}/tables/{t}.parquet" for t in ("events", "stacks", "counters")),
            *_source_urls(c, base, name)]  # fmt: skip
    return {u: c.get(base + u) for u in urls}


@pytest.mark.sweep  # its server fixture alone ~35 s
def test_a_huge_line_number_lists_only_the_files_lines(server, hostile):
    base, proc = server
    with httpx.Client(timeout=120) as c:
        files = c.get(f"{base}/api/p/huge-line/source").json()["files"]
        assert [f["file"] for f in files] == ["train.py"]
        doc = c.get(f"{base}/api/p/huge-line/source/{files[0]['file_id']}").json()
        n = len(TRAIN_PY.splitlines())
        # the file's five lines, then the one line the profile names beyond them
        assert [r["line"] for r in doc["lines"]] == [*range(1, n + 1), HUGE_LINE]
        assert [r["code"] for r in doc["lines"][:n]] == TRAIN_PY.splitlines()
        assert doc["lines"][-1]["code"] is None and doc["lines"][-1]["host_ns"] > 0
        near = c.get(
            f"{base}/api/p/huge-line/source/{files[0]['file_id']}?around={HUGE_LINE}&context=500"
        ).json()
        assert [r["line"] for r in near["lines"]] == [HUGE_LINE]
        near = c.get(
            f"{base}/api/p/huge-line/source/{files[0]['file_id']}?around=4&context=1"
        ).json()
        assert [r["line"] for r in near["lines"]] == [3, 4, 5]
        assert (
            c.get(f"{base}/api/p/huge-line/source/{files[0]['file_id']}?context=501").status_code
            == 422
        )
        assert c.get(f"{base}/api/p/bidi").status_code == 200  # the others still served
    assert proc.poll() is None and peak_rss_mb(proc.pid) < SERVER_MB


@pytest.mark.sweep  # ~50 s: kept out of the default suite's 15 minutes
def test_a_raw_trace_naming_a_huge_line_is_served_bounded(hostile, server_home, tmp_path):
    with (
        serve(hostile.raw_huge_line, tmp_path, server_home) as (base, proc),
        httpx.Client(timeout=120) as c,
    ):
        name = c.get(f"{base}/api/profiles").json()["profiles"][0]["name"]
        files = c.get(f"{base}/api/p/{name}/source").json()["files"]
        lines = c.get(f"{base}/api/p/{name}/source/{files[0]['file_id']}").json()["lines"]
        assert [r["line"] for r in lines] == [1, 2, 3, 4, 5, RAW_HUGE_LINE]
        assert proc.poll() is None and peak_rss_mb(proc.pid) < SERVER_MB


def test_nothing_is_read_through_a_link_out_of_a_profile(server, hostile):
    """Every route of every hostile profile: no answer carries the planted token (in secret.py
    outside, in the tables and manifest the links point to, in the server's environment) or a
    line of /etc/passwd; a profile that links a table or its manifest out is listed with why; a
    named pipe or a huge file in sources/ is not read (the pipe would block its request)."""
    base, proc = server
    with httpx.Client(timeout=120) as c:
        listed = {r["name"]: r for r in c.get(f"{base}/api/profiles").json()["profiles"]}
        for name in LINKED_OUT:
            assert "a symbolic link out of the profile's folder" in listed[name]["error"], listed[
                name
            ]
            assert listed[name]["error"].startswith(f"{name}/"), listed[
                name
            ]  # not the server's path
        leaks, served = [], []
        for name in (p.name for p in sorted(hostile.served.iterdir())):
            for url, r in _every_answer(c, base, name).items():
                if TOKEN in r.text or PASSWD in r.text:
                    leaks.append(url)
                if name in LINKED_OUT and r.status_code not in (404, 422):  # refused profile
                    served.append(url)
        assert leaks == [] and served == []
        for name in (
            "sources-to-root",
            "sources-out",
            "source-file-out",
            "source-fifo",
            "source-huge",
        ):
            files = c.get(f"{base}/api/p/{name}/source").json()["model_files"]
            assert {f["file"] for f in files} >= {"/etc/passwd", "/proc/self/environ", "/secret.py"}
            assert not any(f["has_source"] for f in files), (name, files)
    assert proc.poll() is None


@pytest.mark.sweep  # two servers importing a raw trace: ~20 s quiet (default suite < 15 min)
def test_a_raw_trace_keeps_sources_from_its_own_folder_only(hostile, server_home, tmp_path):
    """A trace saved in ~/Downloads names settings.py, which sits in the home folder above it:
    not kept, unless the user names the home folder with --source-root."""
    for extra, kept in (((), False), (("--source-root", str(hostile.home)), True)):
        cwd = tmp_path / f"cwd-{kept}"
        cwd.mkdir()
        with (
            serve(hostile.downloads_trace, cwd, server_home, *extra) as (base, _),
            httpx.Client(timeout=120) as c,
        ):
            name = c.get(f"{base}/api/profiles").json()["profiles"][0]["name"]
            files = {f["file"]: f for f in c.get(f"{base}/api/p/{name}/source").json()["files"]}
            assert files["settings.py"]["has_source"] is kept
            text = c.get(f"{base}/api/p/{name}/source/{files['settings.py']['file_id']}").text
            assert (TOKEN in text) is kept
        profile = next((cwd / "cache").rglob("manifest.json")).parent
        assert [p.name for p in profile.rglob("*.py")] == (["settings.py"] if kept else [])


def test_no_answer_names_the_home_folder(server, server_home, tmp_path):
    """DuckDB's folders default to the server user's home: its settings and errors showed it."""
    base, _ = server
    queries = ["SELECT * FROM duckdb_extensions()", "SELECT * FROM duckdb_secrets()",
               "SELECT name, value FROM duckdb_settings()",
               "SELECT * FROM read_xlsx('x.xlsx')", "SELECT * FROM read_csv('~/x.csv')"]  # fmt: skip
    with httpx.Client(timeout=120) as c:
        for q in queries:
            r = c.get(f"{base}/api/p/bidi/sql?q={quote(q)}")
            assert r.status_code in (200, 400), (q, r.text[:300])
            assert server_home.name not in r.text, (q, r.text[:300])
        assert server_home.name not in c.get(f"{base}/api/profiles").text


@pytest.fixture(scope="module")
def mcp(hostile, server_home, tmp_path_factory):
    """`call(tool, **args) -> (is_error, document or text)` over `neuron-explorer mcp` serving
    the hostile profiles (the SDK's stdio client, as tests/test_mcp.py)."""
    from anyio.from_thread import start_blocking_portal
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    cwd = tmp_path_factory.mktemp("mcp")
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=_env(cwd, server_home),
                                   args=["-m", "neuron_explorer", "mcp", str(hostile.served)])  # fmt: skip
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(params)) as client:

            def call(tool: str, **args):
                r = portal.call(client.call_tool, tool, args)
                text = r.content[0].text
                return (True, text) if r.is_error else (False, json.loads(text))

            yield call


def test_mcp_tools_stay_inside_and_bounded(mcp, hostile):
    listed = {r["name"]: r for r in mcp("list_profiles")[1]["profiles"]}
    assert all("symbolic link out" in listed[n]["error"] for n in LINKED_OUT)
    err, doc = mcp("source_line", profile="huge-line", file="train.py", line=HUGE_LINE, context=50)
    assert not err and [r["line"] for r in doc["listing"]] == [HUGE_LINE]
    assert doc["this_line"]["code"] is None and doc["has_source"]
    err, doc = mcp("source_line", profile="huge-line", file="train.py", line=4, context=2)
    assert not err and [r["code"] for r in doc["listing"]] == TRAIN_PY.splitlines()[1:]
    answers = []
    for name in (p.name for p in sorted(hostile.served.iterdir())):
        answers += [mcp("summary", profile=name), mcp("hotspots", profile=name),
                    mcp("operators", profile=name), mcp("findings", profile=name),
                    mcp("sql", profile=name, query="SELECT * FROM events"),
                    mcp("timeline", profile=name)]  # fmt: skip
        for file in ("/etc/passwd", "/proc/self/environ", "/secret.py"):
            answers.append(mcp("source_line", profile=name, file=file, line=1))
    for err, doc in answers:
        text = doc if err else str(doc)
        assert TOKEN not in text and PASSWD not in text
    for name in LINKED_OUT:
        assert mcp("summary", profile=name)[0]

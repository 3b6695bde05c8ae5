"""Reading broken profiles: a missing table, corrupt or truncated Parquet, a table of another
schema, a manifest of a newer schema version, of another format or not JSON at all. The CLI's
readers give one line and status 2; the web UI gives an error page (and a JSON error) for that
profile and goes on serving the others."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from neuron_explorer.cli import main
from neuron_explorer.model.schema import FORMAT, SCHEMA_VERSION
from neuron_explorer.web.app import create_app


def _manifest(path: Path, **changes: object) -> None:
    m = json.loads((path / "manifest.json").read_text())
    m.update(changes)
    (path / "manifest.json").write_text(json.dumps(m))


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


BREAKS = {
    "no_stacks": (lambda p: (p / "stacks.parquet").unlink(), "table stacks is missing"),
    "no_events": (lambda p: (p / "events.parquet").unlink(), "table events is missing"),
    "garbage_events": (lambda p: (p / "events.parquet").write_bytes(b"PAR1 not parquet PAR1"),
                       "corrupt Parquet"),
    "truncated_events": (lambda p: _truncate(p / "events.parquet"), "corrupt Parquet"),
    "truncated_counters": (lambda p: _truncate(p / "counters.parquet"), "corrupt Parquet"),
    "foreign_table": (lambda p: pq.write_table(pa.table({"x": ["a"], "y": [1.5]}),
                                               p / "events.parquet"), "events"),
    "newer_schema": (lambda p: _manifest(p, schema_version=SCHEMA_VERSION + 1),
                     "newer than this neuron-explorer reads"),
    "other_format": (lambda p: _manifest(p, format="speedscope"), f"not a {FORMAT} manifest"),
    "manifest_not_json": (lambda p: (p / "manifest.json").write_text('{"format": '),
                          "unreadable manifest"),
    "manifest_bad_steps": (lambda p: _manifest(p, steps="every one"), "malformed manifest"),
}  # fmt: skip
COMMANDS = {
    "summary": ["summary", "{p}"],
    "analyze": ["analyze", "{p}"],
    "query": ["query", "{p}", "SELECT kind, count(*) FROM events GROUP BY kind"],
    "export": ["export", "{p}", "-o", "{out}/trace.json.gz"],
}


@pytest.fixture(scope="module")
def root(tmp_path_factory, imported_profiles):
    """`good` (the shared compare_base trace imported) and one broken copy per BREAKS entry."""
    root = tmp_path_factory.mktemp("broken") / "profiles"
    root.mkdir()
    shutil.copytree(imported_profiles["compare_base"], root / "good")
    for name, (breaker, _) in BREAKS.items():
        shutil.copytree(imported_profiles["compare_base"], root / name)
        breaker(root / name)
    return root


def cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return rc, err.getvalue()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("broken", BREAKS)
def test_cli_readers_fail_in_one_line(root, tmp_path, command, broken):
    argv = [a.format(p=root / broken, out=tmp_path) for a in COMMANDS[command]]
    rc, err = cli(argv)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, (argv, rc, err[-2000:])
    assert lines[0].startswith(f"neuron-explorer: error: {root / broken}"), lines[0]
    assert BREAKS[broken][1] in lines[0], lines[0]
    assert not list(tmp_path.iterdir()), "a failed export left output behind"


@pytest.mark.parametrize("command", COMMANDS)
def test_cli_readers_work_on_the_intact_copy(root, tmp_path, command):
    rc, err = cli([a.format(p=root / "good", out=tmp_path) for a in COMMANDS[command]])
    assert rc == 0, err


def test_web_shows_an_error_page_per_broken_profile_and_serves_the_rest(root):
    client = TestClient(create_app(root))
    listed = {r["name"]: r for r in client.get("/api/profiles").json()["profiles"]}
    assert not listed["good"].get("error") and listed["good"]["steps"]
    for name, (_, problem) in BREAKS.items():
        assert problem in listed[name]["error"], (name, listed[name])
        for url in (f"/p/{name}", f"/p/{name}/timeline", f"/p/{name}/sql"):
            r = client.get(url)
            assert r.status_code == 422 and "error-box" in r.text, (url, r.status_code)
            assert problem in r.text and "Traceback" not in r.text, (url, r.text[-500:])
        for url in (f"/api/p/{name}", f"/api/p/{name}/operators", f"/api/p/{name}/sql?q=SELECT 1"):
            r = client.get(url)
            assert r.status_code == 422 and problem in r.json()["error"], (url, r.text[:300])
        # the other profiles are unaffected
        assert client.get("/api/p/good").json()["name"] == "good"
    assert client.get("/p/good/timeline").status_code == 200
    assert client.get("/api/p/good/timeline").json()["window"]

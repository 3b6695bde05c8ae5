"""The excerpt of a profile too big to analyse whole (model/excerpt.py, issue 31): exactly the
events of its window, read out of core; the import cuts it under a small --memory-budget and
stores its analysis; the CLI and a real server's analysis pages read it and say so."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import duckdb
import httpx
import pytest

from neuron_explorer.analysis import stored, summarize
from neuron_explorer.analysis.operators import operators
from neuron_explorer.analysis.runner import findings_report
from neuron_explorer.analysis.scoped import analysed, scope_line
from neuron_explorer.entry import main
from neuron_explorer.model import Profile, footprint
from neuron_explorer.model.excerpt import FOLDER, choose, open_excerpt, scope_of, write_excerpt
from neuron_explorer.web.memory import EVENT_BYTES

ROOT = Path(__file__).resolve().parent.parent
MLP_TRACE = ROOT / "samples" / "traces" / "cpu_mlp_train.pt.trace.json.gz"  # stacks, counters
NS_TRACE = ROOT / "tests/data/kineto-gpu/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # fmt: skip
DDP = ROOT / "samples" / "profiles" / "ddp_straggler"  # a capture of two ranks, with sources


@pytest.fixture
def scaled_down(monkeypatch):
    """The analysis's memory without its fixed part (footprint.BASE_BYTES, 512 MB) and at 256 B
    an event besides the columns, so a budget of a few hundred KB cuts a tests/data trace as
    2 GB cuts a big one."""
    monkeypatch.setattr(footprint, "BASE_BYTES", 0)
    monkeypatch.setattr(footprint, "EVENT_BYTES", 256)


def whole_sql(profile: Profile, sql: str) -> list[tuple]:
    con = duckdb.connect()
    for t in ("events", "stacks", "counters"):
        con.register(t, profile.dataset(t))
    return con.execute(sql).fetchall()


def in_window(spans: dict[int, tuple[int, int]], time: str) -> str:
    return " OR ".join(f"(rank = {r} AND {time} >= {s} AND {time} < {e})"
                       for r, (s, e) in spans.items())  # fmt: skip


def check_excerpt(whole: Profile, part: Profile, spans: dict[int, tuple[int, int]]) -> None:
    """`part` holds exactly the events and counters of `spans` (by DuckDB over the whole), the
    stacks they use, no parent or flow leading out of it, and is a profile the analysis reads."""
    want = whole_sql(whole, f"SELECT id FROM events WHERE {in_window(spans, 'start_ns')}")
    got = part.table("events", columns=["id"]).column("id").to_pylist()
    assert sorted(got) == sorted(i for (i,) in want) and len(got) == len(set(got))
    ids = set(got)
    ev = part.table("events").to_pylist()
    assert all(e["parent_id"] is None or e["parent_id"] in ids for e in ev)
    # the other columns are the whole's, but for parents and flows that led out
    before = {r["id"]: r for r in whole.table("events").to_pylist() if r["id"] in ids}
    dropped = [e for e in ev if e["parent_id"] != before[e["id"]]["parent_id"]]
    assert all(e["parent_id"] is None and before[e["id"]]["parent_id"] not in ids
               for e in dropped)  # fmt: skip
    for e in ev:
        assert {**e, "parent_id": None, "flow_id": None} == \
            {**before[e["id"]], "parent_id": None, "flow_id": None}  # fmt: skip
    flows = Counter(e["flow_id"] for e in ev if e["flow_id"] is not None)
    everywhere = dict(whole_sql(whole, "SELECT flow_id, count(*) FROM events GROUP BY flow_id"))
    assert all(everywhere[f] == n for f, n in flows.items())  # a flow kept is kept whole
    lost = {before[e["id"]]["flow_id"] for e in ev if e["flow_id"] is None} - {None}
    assert all(everywhere[f] > sum(before[i]["flow_id"] == f for i in ids) for f in lost)
    stack_ids = {e["stack_id"] for e in ev if e["stack_id"] is not None}
    kept = set(part.table("stacks", columns=["stack_id"]).column("stack_id").to_pylist())
    assert stack_ids == kept
    (frames,) = whole_sql(whole, "SELECT count(*) FROM stacks WHERE stack_id IN "
                          f"({','.join(map(str, stack_ids)) or 'NULL'})")[0]  # fmt: skip
    assert part.row_count("stacks") == frames
    (counters,) = whole_sql(whole, f"SELECT count(*) FROM counters WHERE "
                            f"{in_window(spans, 'ts_ns')}")[0]  # fmt: skip
    assert part.row_count("counters") == counters
    assert part.manifest.row_counts["events"] == len(got)
    assert summarize(part).n_events == len(got)
    assert findings_report(part).scope == scope_of(part) is not None


@pytest.mark.parametrize("name", ["cpu_mlp", "ns_resolution", "nccl"])
def test_an_excerpt_holds_exactly_the_events_of_its_steps(imported_profiles, tmp_path, name):
    copy = tmp_path / name
    shutil.copytree(imported_profiles[name], copy)
    whole = Profile.open(copy)
    n = whole.row_count("events")
    window = choose(whole, n // 2)
    numbers = sorted({s.step for s in whole.manifest.steps})
    assert window.first is not None and window.first != numbers[0]  # never the warm-up step
    assert window.events <= n // 2
    part = write_excerpt(whole, window, "a test")
    assert part.path == copy / FOLDER and part.row_count("events") == window.events
    check_excerpt(whole, part, window.spans)
    kept = sorted({s.step for s in part.manifest.steps})
    assert kept == [s for s in numbers if window.first <= s <= window.last]
    scope = scope_of(part)
    assert scope["steps"] == [window.first, window.last] and scope["of_events"] == n
    assert open_excerpt(Profile.open(copy)).path == part.path
    assert scope_of(whole) is None and summarize(whole).scope is None


def test_an_excerpt_of_two_ranks_keeps_each_ranks_window_and_the_sources(tmp_path):
    shutil.copytree(DDP, tmp_path / "ddp")
    whole = Profile.open(tmp_path / "ddp")
    window = choose(whole, whole.row_count("events") * 2 // 3)
    assert sorted(window.spans) == [0, 1] and window.spans[0] != window.spans[1]
    part = write_excerpt(whole, window, "a test")
    check_excerpt(whole, part, window.spans)
    assert part.manifest.ranks == (0, 1)
    kept = sorted((part.path / "sources").rglob("*.py"))
    assert kept and [f.read_bytes() for f in kept] == [
        (whole.path / f.relative_to(part.path)).read_bytes() for f in kept]  # fmt: skip


def test_a_profile_without_steps_is_cut_by_time(imported_profiles, tmp_path):
    shutil.copytree(imported_profiles["alexnet"], tmp_path / "a")
    whole = Profile.open(tmp_path / "a")
    assert not whole.manifest.steps
    window = choose(whole, whole.row_count("events") // 3)
    assert window.first is None and 0 < window.events <= whole.row_count("events") // 3
    part = write_excerpt(whole, window, "a test")
    check_excerpt(whole, part, window.spans)
    assert scope_of(part)["window_ns"] == list(window.spans[0])


def test_an_excerpt_of_another_profile_is_not_used(imported_profiles, tmp_path):
    shutil.copytree(imported_profiles["cpu_mlp"], tmp_path / "a")
    whole = Profile.open(tmp_path / "a")
    write_excerpt(whole, choose(whole, 600), "a test")
    assert analysed(Profile.open(tmp_path / "a")).path == tmp_path / "a" / FOLDER
    # the events table replaced by another import's: the excerpt is not of it
    shutil.copy(imported_profiles["ns_resolution"] / "events.parquet", tmp_path / "a")
    assert open_excerpt(Profile.open(tmp_path / "a")) is None
    assert analysed(Profile.open(tmp_path / "a")).path == tmp_path / "a"


def test_the_import_under_a_small_budget_analyses_an_excerpt_and_the_cli_says_so(
    tmp_path, capsys, scaled_down
):
    out = tmp_path / "mlp"
    # the profile's 1,570 events x (256 B + 252 B of columns) are ~780 KB of analysis: over 600 KB
    assert main(["import", str(MLP_TRACE), "-o", str(out), "--memory-budget", "600K"]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("analysed:"))
    assert "steps 3-4 (2 of 3 steps, 1,005 of 1,570 events)" in line
    assert "over the 600 KB memory budget (--memory-budget)" in line
    part = Profile.open(out / FOLDER)
    assert footprint.analysis_bytes(part) <= 600 << 10  # what a server admits it by, too
    # its analysis is stored in its own folder, as computing it gives, scope included
    summary = stored.load(part, "summary")
    assert summary == json.loads(json.dumps(summarize(Profile.open(out / FOLDER)).to_dict()))
    assert summary["scope"]["steps"] == [3, 4] and summary["scope"]["of_events"] == 1570
    assert stored.load(part, "findings_report")["scope"] == summary["scope"]
    assert not (out / "analysis" / "summary.json").exists()
    for command in ("summary", "analyze", "operators", "lines"):
        assert main([command, str(out)]) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith(scope_line(summary["scope"])), command
    assert main(["summary", "--json", str(out)]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["scope"] == summary["scope"]
    assert printed.err.startswith("analysed: steps 3-4")
    # analyze prints the stored findings: the document computing them gives
    assert main(["analyze", "--json", str(out)]) == 0
    doc = findings_report(Profile.open(out / FOLDER)).to_dict()
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(doc))
    assert main(["operators", "--json", str(out)]) == 0  # from the stored operator table
    ops = operators(Profile.open(out / FOLDER)).to_dict()
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(ops, default=str))


def test_the_import_under_the_default_budget_analyses_the_whole_as_before(tmp_path, capsys):
    out = tmp_path / "mlp"
    assert main(["import", str(MLP_TRACE), "-o", str(out)]) == 0
    assert "analysed:" not in capsys.readouterr().err
    assert not (out / FOLDER).exists() and analysed(Profile.open(out)).path == out
    assert summarize(Profile.open(out)).scope is None
    assert main(["summary", str(out)]) == 0
    assert not capsys.readouterr().out.startswith("analysed:")


def _rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _serve(root: Path, cache: Path, max_memory: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache)}
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "serve", str(root),
                             "--port", str(port), "--max-memory", str(max_memory)],
                            env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(base + "/static/app.css", timeout=1)
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start")


@pytest.mark.sweep  # 45-95 s here: a 272k-event import and two servers; in-process sibling below
def test_a_server_whose_ceiling_refuses_the_whole_serves_the_excerpts_analysis(
    imported_profiles, tmp_path, scaled_down
):
    # the ns-resolution GPU trace six times over: 272k real events, ~230 MB to admit whole
    doc = json.loads(gzip.decompress(NS_TRACE.read_bytes()))
    doc["traceEvents"] = doc["traceEvents"] * 6
    trace = tmp_path / "big.json"
    trace.write_text(json.dumps(doc))
    served = tmp_path / "served"
    assert main(["import", str(trace), "-o", str(served / "big"), "-q",
                 "--memory-budget", "8M"]) == 0  # fmt: skip
    whole, part = Profile.open(served / "big"), Profile.open(served / "big" / FOLDER)
    need = whole.footer_rows["events"] * EVENT_BYTES + whole.footer_bytes
    assert part.row_count("events") * 4 < whole.row_count("events")
    # what a server holds before it reads a large profile, from one serving a small one
    shutil.copytree(imported_profiles["cpu_only"], tmp_path / "small" / "p")
    proc, base = _serve(tmp_path / "small", tmp_path / "cache0", 64 << 30)
    try:
        assert httpx.get(base + "/api/profiles", timeout=60).status_code == 200
        held = _rss(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # a ceiling that leaves the whole profile's tables about half of what they need beside
    # the server (which holds some 60 MB less than `held` when it starts: no profile read yet)
    proc, base = _serve(served, tmp_path / "cache", held + need // 4)
    try:
        r = httpx.get(f"{base}/api/p/big", timeout=120)
        assert r.status_code == 200, r.text[:300]
        page = r.json()
        assert page["name"] == "big" and page["scope"]["steps"] == scope_of(part)["steps"]
        assert page["summary"]["scope"]["of_events"] == whole.row_count("events")
        assert page["summary"]["n_events"] == part.row_count("events")
        assert "timeline, find and SQL show the whole profile" in page["scope"]["line"]
        for twin in ("findings", "operators"):
            r = httpx.get(f"{base}/api/p/big/{twin}", timeout=120)
            assert r.status_code == 200 and r.json()["scope"] == page["scope"], r.text[:300]
        html = httpx.get(f"{base}/p/big/operators", timeout=60).text
        assert 'class="scope-banner"' in html and "analysed: " in html
        assert 'class="scope-banner"' not in httpx.get(f"{base}/p/big/timeline", timeout=60).text
        httpx.get(f"{base}/api/p/big/timeline", timeout=120)  # whole: 200 or 503, not asserted
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_analysis_pages_of_a_profile_too_big_for_the_ceiling_read_its_excerpt(
    imported_profiles, tmp_path, monkeypatch
):
    """The in-process sibling of the real server's test: the whole profile's tables are made
    to need more than the ceiling by their bytes an event (web/memory.EVENT_BYTES)."""
    from fastapi.testclient import TestClient

    import neuron_explorer.web.service as service
    from neuron_explorer.analysis.scoped import store_excerpt
    from neuron_explorer.web.app import create_app

    shutil.copytree(imported_profiles["ns_resolution"], tmp_path / "p" / "ns")
    whole = Profile.open(tmp_path / "p" / "ns")
    part = store_excerpt(whole, 8 << 20, "a test")  # 8 MB of analysis: about 16k events
    assert 0 < part.row_count("events") < whole.row_count("events") // 2
    monkeypatch.setattr(footprint, "EVENT_BYTES", 64 << 10)  # the whole: ~2.8 GB, the part 0.6
    # the ceiling over what this process holds already (a long test session holds a lot)
    ceiling = service.rss_bytes() + (3 << 29)
    app = create_app(tmp_path / "p", analysis_cache=tmp_path / "cache", max_memory=ceiling)
    client = TestClient(app)
    page = client.get("/api/p/ns").json()
    assert page["name"] == "ns" and page["scope"]["events"] == part.row_count("events")
    assert page["summary"]["n_events"] == part.row_count("events")
    for twin in ("findings", "operators", "modules", "calltree"):
        r = client.get(f"/api/p/ns/{twin}")
        assert r.status_code == 200 and r.json()["scope"] == page["scope"], (twin, r.text[:300])
    assert 'class="scope-banner"' in client.get("/p/ns/findings").text
    assert 'class="scope-banner"' not in client.get("/p/ns/sql").text
    assert "scope" not in client.get("/api/p/ns/sql", params={"q": "SELECT 1"}).json()
    # compare reads each side's excerpt when it has one, and says which did
    shutil.copytree(imported_profiles["cpu_only"], tmp_path / "p" / "small")
    both = client.get("/api/compare", params={"a": "small", "b": "ns"}).json()
    assert (both.get("a"), both.get("b")) == ("small", "ns") and "scope_a" not in both
    assert both["scope_b"] == page["scope"]
    # the profile list shows the excerpt's findings, under the profile's own name
    rows = {r["name"]: r for r in client.get("/api/profiles").json()["profiles"]}
    assert not rows["ns"].get("error") and rows["ns"]["events"] == whole.row_count("events")


def _stale_excerpt(imported_profiles, tmp_path, monkeypatch) -> tuple[Profile, Profile, int]:
    """(the whole, its excerpt, the budget it was cut for): the ns-resolution trace's profile
    cut for a budget whose analysis an older version of the code stored."""
    import neuron_explorer.web.service as service
    from neuron_explorer.analysis.scoped import store_excerpt

    shutil.copytree(imported_profiles["ns_resolution"], tmp_path / "p" / "ns")
    whole = Profile.open(tmp_path / "p" / "ns")
    # the fixed part is what this process holds (a long test session holds a lot) and some
    # room; the tables 64 KB an event, so the whole needs ~2.8 GB and the budget leaves 1 GB
    monkeypatch.setattr(footprint, "BASE_BYTES", service.rss_bytes() + (128 << 20))
    monkeypatch.setattr(footprint, "EVENT_BYTES", 64 << 10)
    budget = footprint.BASE_BYTES + (1 << 30)
    with monkeypatch.context() as older:  # the analysis an older version stored
        older.setattr(stored, "code_version", lambda kind: "an older version")
        part = store_excerpt(whole, budget, "a test")
    return whole, part, budget


def test_a_server_whose_ceiling_is_the_imports_budget_analyses_a_stale_excerpt_again(
    imported_profiles, tmp_path, monkeypatch
):
    """An excerpt cut for a --memory-budget whose stored analysis is stale (an older version
    of the code wrote it) is analysed again by a server with that budget as --max-memory: the
    import sizes it by the estimate the server admits tables by (model/footprint.py)."""
    from fastapi.testclient import TestClient

    from neuron_explorer.web.app import create_app

    whole, part, budget = _stale_excerpt(imported_profiles, tmp_path, monkeypatch)
    assert 0 < part.row_count("events") < whole.row_count("events") // 2
    assert footprint.analysis_bytes(part) <= budget
    assert stored.load(part, "summary") is None  # stale: not read
    app = create_app(tmp_path / "p", analysis_cache=tmp_path / "cache", max_memory=budget)
    client = TestClient(app)
    r = client.get("/api/p/ns")
    assert r.status_code == 200, r.text[:300]
    page = r.json()
    assert page["summary"]["n_events"] == part.row_count("events")  # computed again, here
    assert page["scope"]["events"] == part.row_count("events")
    for twin in ("findings", "operators", "modules"):
        r = client.get(f"/api/p/ns/{twin}")
        assert r.status_code == 200 and r.json()["scope"] == page["scope"], (twin, r.text[:300])


def test_a_stale_analysis_a_server_cannot_compute_again_is_served_saying_so_until_stored_anew(
    imported_profiles, tmp_path, monkeypatch, capsys
):
    """Under a ceiling below the budget the excerpt was cut for, its stale stored analysis
    is served (not a 503), each answer's `scope` and the page's banner saying so and how to
    store it anew; `analyze --store` does, and the same server then serves the new one."""
    from fastapi.testclient import TestClient

    import neuron_explorer.web.service as service
    from neuron_explorer.web.app import create_app

    whole, part, budget = _stale_excerpt(imported_profiles, tmp_path, monkeypatch)
    ceiling = service.rss_bytes() + (256 << 20)  # the excerpt's tables need ~1 GB
    client = TestClient(create_app(tmp_path / "p", analysis_cache=tmp_path / "cache",
                                   max_memory=ceiling))  # fmt: skip
    r = client.get("/api/p/ns")
    assert r.status_code == 200, r.text[:300]
    page = r.json()
    assert page["summary"]["n_events"] == part.row_count("events")  # the stored one
    scope = page["scope"]
    assert scope["stale"] is True and scope["events"] == part.row_count("events")
    assert f"`neuron-explorer analyze {whole.path} --store` stores it anew" in scope["line"]
    for twin in ("findings", "operators"):
        r = client.get(f"/api/p/ns/{twin}")
        assert r.status_code == 200 and r.json()["scope"] == scope, (twin, r.text[:300])
    assert client.get("/api/p/ns/modules").status_code == 503  # not stored: computed, or not
    assert "stored by an earlier version" in client.get("/p/ns/findings").text  # the banner
    # stored anew, as this version cuts the excerpt (the same one: the same estimate)
    assert main(["analyze", str(whole.path), "--store", "--memory-budget", str(budget)]) == 0
    assert capsys.readouterr().err.startswith("analysed: ")
    fresh = Profile.open(whole.path / FOLDER)
    assert stored.load(fresh, "summary")["n_events"] == fresh.row_count("events")
    page = client.get("/api/p/ns").json()
    assert "stale" not in page["scope"] and "earlier version" not in page["scope"]["line"]


def test_a_stored_analysis_of_an_older_layout_that_cannot_be_computed_again_says_how_to_store_it(
    imported_profiles, tmp_path, monkeypatch
):
    """A stored file written before its first line named the tables alone cannot be told to be
    of these tables: under a ceiling that refuses computing it again, the 503 says how to
    store it anew."""
    from fastapi.testclient import TestClient

    import neuron_explorer.web.service as service
    from neuron_explorer.web.app import create_app

    _, part, _ = _stale_excerpt(imported_profiles, tmp_path, monkeypatch)
    for f in (part.path / "analysis").iterdir():  # the code's hash only, as before
        head, _, body = f.read_bytes().partition(b"\n")
        f.write_bytes(head.partition(b" ")[0] + b"\n" + body)
    ceiling = service.rss_bytes() + (256 << 20)
    client = TestClient(create_app(tmp_path / "p", analysis_cache=tmp_path / "cache",
                                   max_memory=ceiling))  # fmt: skip
    r = client.get("/api/p/ns")
    assert r.status_code == 503
    # (an error names paths under the served folder relative to it: web/responses.py)
    assert "`neuron-explorer analyze ns --store` stores it anew" in r.json()["error"]

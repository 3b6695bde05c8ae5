"""The analysis a profile keeps in its folder (analysis/stored.py, docs/format.md): what it
stores is exactly what computing gives, on every real trace in tests/data and a sample capture;
a stale or damaged file is ignored; the import leaves it in a large profile; and a real server's
first page reads it without decoding the events and answers as without it."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import kineto_trace_paths

from neuron_explorer.analysis import stored
from neuron_explorer.model import Profile, footprint
from neuron_explorer.model.bounds import machine_bytes

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "samples" / "profiles" / "gpt_train"  # a real capture on the neuron device
NS_TRACE = ROOT / "tests/data/kineto-gpu/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"  # fmt: skip


def as_served(value):
    """A value as a JSON answer carries it (tuples become lists)."""
    return value if hasattr(value, "schema") else json.loads(json.dumps(value))


def assert_exact(profile_dir: Path) -> None:
    """Every stored kind, read back, equals computing it on a fresh open of the profile."""
    assert stored.write(Profile.open(profile_dir)) == list(stored.KINDS)
    fresh = Profile.open(profile_dir)
    for kind, compute in stored.KINDS.items():
        got = stored.load(Profile.open(profile_dir), kind)
        assert got is not None, kind
        want = as_served(compute(fresh))
        if kind.endswith("_table"):
            assert got.equals(want), (profile_dir.name, kind)
        else:
            assert got == want, (profile_dir.name, kind)


@pytest.mark.parametrize("name", sorted(kineto_trace_paths()))
def test_stored_values_equal_computed_ones_on_every_real_trace(imported_profiles, tmp_path, name):
    copy = tmp_path / name
    shutil.copytree(imported_profiles[name], copy)  # the session's profiles stay as imported
    assert_exact(copy)


def test_stored_values_equal_computed_ones_on_a_sample_capture(tmp_path):
    shutil.copytree(GPT, tmp_path / "gpt")
    (tmp_path / "gpt" / "analysis").mkdir()
    (tmp_path / "gpt" / "analysis" / ".summary.json.x1.tmp").write_text("{")  # a killed write's
    assert_exact(tmp_path / "gpt")
    assert not list((tmp_path / "gpt" / "analysis").glob(".*"))
    # the summary names the folder it is opened from, not the one it was stored in
    shutil.move(tmp_path / "gpt", tmp_path / "moved")
    moved = Profile.open(tmp_path / "moved")
    assert stored.load(moved, "summary")["profile"] == str(moved.path)


def test_a_stale_or_damaged_file_is_ignored(imported_profiles, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(imported_profiles["compare_base"], a)
    shutil.copytree(imported_profiles["compare_test"], b)
    stored.write(Profile.open(a))
    assert stored.load(Profile.open(a), "ops_table") is not None
    # a rewritten events table (same manifest): every stored value is stale
    shutil.copy(b / "events.parquet", a / "events.parquet")
    assert all(stored.load(Profile.open(a), k) is None for k in stored.KINDS)
    # stored by another version of the code: a different identity line
    stored.write(Profile.open(a))
    f = stored.path(Profile.open(a), "devices")
    f.write_bytes(b"0" * 40 + f.read_bytes()[40:])
    assert stored.load(Profile.open(a), "devices") is None
    # a truncated file
    t = stored.path(Profile.open(a), "lines_table")
    t.write_bytes(t.read_bytes()[:-100])
    assert stored.load(Profile.open(a), "lines_table") is None
    assert stored.load(Profile.open(a), "summary") is not None  # the others still hold
    # a named pipe where a file should be is not opened for reading (it would block)
    stored.path(Profile.open(a), "devices").unlink()
    os.mkfifo(stored.path(Profile.open(a), "devices"))
    assert stored.load(Profile.open(a), "devices") is None


def test_each_kinds_code_version_covers_its_code_and_only_it():
    here = Path(stored.__file__).resolve()

    def closure(kind: str) -> set[str]:
        files: set[Path] = set()
        for module in stored.ENTRIES[kind]:
            files |= stored._imported(here.with_name(f"{module}.py"), ROOT / "neuron_explorer")
        return {f.relative_to(ROOT).as_posix() for f in files}

    summary = closure("summary")
    for needed in ("summary", "facts", "breakdown", "context", "operators", "steps", "engines"):
        assert f"neuron_explorer/analysis/{needed}.py" in summary
    assert {"neuron_explorer/model/profile.py", "neuron_explorer/vocab/intervals.py"} <= summary
    assert not any("/rules/" in f or "/web/" in f for f in summary)  # a rule's edit keeps it
    report = closure("findings_report")
    assert "neuron_explorer/analysis/rules/launch_bound.py" in report
    assert "neuron_explorer/analysis/facts.py" in report
    assert len({stored.code_version(k) for k in stored.KINDS}) == len(stored.KINDS)


def test_a_profile_that_cannot_be_written_is_computed_as_before(imported_profiles, tmp_path):
    prof = tmp_path / "ro"
    shutil.copytree(imported_profiles["cpu_only"], prof)
    (prof / "analysis").write_text("")  # a file where the folder would go (root writes anywhere)
    assert stored.write(Profile.open(prof)) == []
    assert stored.load(Profile.open(prof), "summary") is None


def _serve(root: Path, cache: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import sys, uvicorn; from neuron_explorer.web.app import create_app; "
            f"uvicorn.run(create_app(sys.argv[1], analysis_cache=sys.argv[2]), host='127.0.0.1', "
            f"port={port}, log_level='warning')")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code, str(root), str(cache)])
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(base + "/static/app.css", timeout=1)
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start")


@pytest.mark.slow
def test_the_import_stores_a_large_profiles_first_page_and_a_server_serves_it(tmp_path):
    from neuron_explorer.entry import main

    # the ns-resolution GPU trace three times over: 136k real events, over STORE_MIN_EVENTS
    doc = json.loads(gzip.decompress(NS_TRACE.read_bytes()))
    doc["traceEvents"] = doc["traceEvents"] * 3
    trace = tmp_path / "big.json"
    trace.write_text(json.dumps(doc))
    with_store, without = tmp_path / "a" / "big", tmp_path / "b" / "big"
    assert main(["import", str(trace), "-o", str(with_store), "-q"]) == 0
    assert Profile.open(with_store).manifest.row_counts["events"] >= stored.STORE_MIN_EVENTS
    assert sorted(f.name for f in (with_store / "analysis").iterdir()) == [
        "devices.json", "findings_report.json", "lines_table.arrow", "ops_table.arrow",
        "summary.json"]  # fmt: skip
    shutil.copytree(with_store, without, ignore=shutil.ignore_patterns("analysis"))
    pages, twins = {}, {}
    for label, prof in (("stored", with_store), ("computed", without)):
        proc, base = _serve(prof, tmp_path / f"cache-{label}")
        try:
            r = httpx.get(f"{base}/api/p/big", timeout=120)
            assert r.status_code == 200, r.text[:300]
            pages[label] = r.json()
            twins[label] = httpx.get(f"{base}/api/p/big/findings", timeout=300).json()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    # a first page with its findings (under LIST_INLINE_EVENTS the computed one has them too)
    assert not pages["stored"]["analysis_pending"] and pages["stored"]["findings"]
    for page in (*pages.values(), *twins.values()):
        page.pop("profile", None)  # the two copies' paths
        if "summary" in page:
            page["summary"]["profile"] = None
    assert pages["stored"] == pages["computed"] and twins["stored"] == twins["computed"]


def test_an_analysis_too_big_for_the_machine_is_made_of_an_excerpt_and_the_import_says_so(
    tmp_path, monkeypatch, capsys
):
    """A 10 GB trace's profile (66 M events) would need ~34 GB to analyze: the import writes
    the profile and analyses an excerpt of its middle steps (model/excerpt.py), in one line,
    instead of taking the machine down. Here the share of the machine is lowered until a real
    136k-event profile is over it (the import's --memory-budget: tests/test_excerpt.py)."""
    from neuron_explorer.entry import main

    doc = json.loads(gzip.decompress(NS_TRACE.read_bytes()))
    doc["traceEvents"] = doc["traceEvents"] * 3
    trace = tmp_path / "big.json"
    trace.write_text(json.dumps(doc))
    # just under what the profile's events need: 136k events x (384 B + their columns)
    monkeypatch.setattr(footprint, "BASE_BYTES", 0)  # its tables only
    monkeypatch.setattr(footprint, "EVENT_BYTES", 384)
    monkeypatch.setattr(stored, "STORE_SHARE", 60e6 / machine_bytes())
    out = tmp_path / "big"
    assert main(["import", str(trace), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "the whole profile's analysis would need about 66 MB, over 57 MB (half of this " \
        "machine's memory)" in err  # fmt: skip
    assert sorted(f.name for f in (out / "analysis").iterdir()) == ["excerpt"]
    part = Profile.open(out / "analysis" / "excerpt")
    assert footprint.analysis_bytes(part) <= 60e6
    assert stored.load(part, "summary")["scope"]["of_events"] >= stored.STORE_MIN_EVENTS


def test_the_first_page_reads_the_stored_analysis(tmp_path):
    from fastapi.testclient import TestClient

    import neuron_explorer.analysis.context as analysis_context
    from neuron_explorer.web.app import create_app

    shutil.copytree(GPT, tmp_path / "p" / "gpt")
    stored.write(Profile.open(tmp_path / "p" / "gpt"))
    app = create_app(tmp_path / "p", analysis_cache=tmp_path / "cache")
    r = TestClient(app).get("/api/p/gpt")
    assert r.status_code == 200 and r.json()["summary"]["step_stats"]["count"]
    assert not r.json()["analysis_pending"] and r.json()["findings"]
    # the summary, findings, devices and tables came from the profile's folder: the server
    # never decoded the events
    assert app.state.store.open("gpt") not in analysis_context._CACHE
    twin = TestClient(app).get("/api/p/gpt/findings").json()
    assert twin["findings"][0]["title"] == r.json()["findings"][0]["title"]

"""The web server's analysis cache on disk (web/cache.py), on real profiles: a second server of
the same profile reads the summary, findings and tables back instead of computing them, a
changed profile or a damaged entry is computed again, nothing is written inside the profile,
and the profile list does not wait for the analysis of a large profile."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import neuron_explorer.analysis.context as analysis_context
from neuron_explorer.analysis import run_rules
from neuron_explorer.model import Profile
from neuron_explorer.web import service as web_app
from neuron_explorer.web.app import create_app
from neuron_explorer.web.cache import AnalysisCache, profile_identity

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "samples" / "profiles" / "gpt_train"  # a real capture on the neuron device
OTHER = ROOT / "samples" / "profiles" / "gpt_compile"
KINDS = ("summary", "findings", "devices", "ops_table", "lines_table")


@pytest.fixture
def served(tmp_path: Path) -> Path:
    """A folder holding a copy of the gpt_train capture (copied, so tests may change it)."""
    root = tmp_path / "profiles"
    root.mkdir()
    shutil.copytree(GPT, root / "gpt")
    return root


def entries(cache: Path, profile: Path) -> dict[str, Path]:
    store = AnalysisCache(cache)
    prof = Profile.open(profile)
    return {kind: store.path(prof, kind) for kind in KINDS}


def summary_page(app) -> dict:
    r = TestClient(app).get("/api/p/gpt")
    assert r.status_code == 200, r.text[:300]
    return r.json()


def test_a_second_server_reads_the_analysis_back(served, tmp_path):
    cache = tmp_path / "cache"
    first = summary_page(create_app(served, analysis_cache=cache))
    files = entries(cache, served / "gpt")
    assert all(f.is_file() for f in files.values())
    assert not any(served.glob("gpt/**/*.json.tmp")) and not (served / "gpt" / "cache").exists()
    written = {k: (f.stat().st_ino, f.stat().st_mtime_ns) for k, f in files.items()}

    app = create_app(served, analysis_cache=cache)
    again = summary_page(app)
    assert again == first
    # nothing was computed again: every entry is the same file, unrewritten...
    assert {k: (f.stat().st_ino, f.stat().st_mtime_ns) for k, f in files.items()} == written
    # ...and the second server never decoded the events for the analysis
    assert app.state.store.open("gpt") not in analysis_context._CACHE
    # the values are the ones the analysis computes
    top = run_rules(Profile.open(served / "gpt"))[0]
    assert again["findings"][0]["title"] == top.title


def test_a_changed_profile_is_analysed_again(served, tmp_path):
    cache = tmp_path / "cache"
    before = summary_page(create_app(served, analysis_cache=cache))
    summary_file = entries(cache, served / "gpt")["summary"]
    old = summary_file.stat().st_ino
    # the profile is recaptured: another real capture takes its place under the same name
    shutil.rmtree(served / "gpt")
    shutil.copytree(OTHER, served / "gpt")
    after = summary_page(create_app(served, analysis_cache=cache))
    assert summary_file.stat().st_ino != old  # rewritten
    assert after["summary"]["n_events"] == Profile.open(OTHER).row_count("events")
    assert after["summary"]["n_events"] != before["summary"]["n_events"]
    assert json.loads(summary_file.read_bytes().partition(b"\n")[2]) == after["summary"]


def test_a_touched_parquet_file_changes_the_identity(served):
    prof = Profile.open(served / "gpt")
    before = profile_identity(prof)
    events = served / "gpt" / "events.parquet"
    st = events.stat()
    os.utime(events, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert profile_identity(Profile.open(served / "gpt")) != before


def test_a_damaged_entry_is_ignored_and_replaced(served, tmp_path):
    cache = tmp_path / "cache"
    first = summary_page(create_app(served, analysis_cache=cache))
    files = entries(cache, served / "gpt")
    files["summary"].write_bytes(b"not json at all")
    head = files["ops_table"].read_bytes().partition(b"\n")[0]
    files["ops_table"].write_bytes(head + b"\nnot arrow either")
    again = summary_page(create_app(served, analysis_cache=cache))
    assert again == first
    assert json.loads(files["summary"].read_bytes().partition(b"\n")[2]) == first["summary"]


def test_an_unwritable_cache_still_serves(served, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    page = summary_page(create_app(served, analysis_cache=blocked))
    assert page["summary"]["n_events"] == Profile.open(served / "gpt").row_count("events")


@pytest.mark.parametrize("limit", ["LIST_INLINE_EVENTS", "LIST_INLINE_S"])
def test_profile_list_does_not_wait_for_the_analysis(served, tmp_path, monkeypatch, limit):
    # every profile counts as large (or the time for analysing on the spot is used up), so the
    # list must not analyse any on the spot
    monkeypatch.setattr(web_app, limit, 0)
    cache = tmp_path / "cache"
    client = TestClient(create_app(served, analysis_cache=cache))
    row = client.get("/api/profiles").json()["profiles"][0]
    assert row["analysis_pending"] and row["top_finding"] is None
    deadline = time.monotonic() + 60
    while row["analysis_pending"] and time.monotonic() < deadline:
        time.sleep(0.2)
        row = client.get("/api/profiles").json()["profiles"][0]
    top = run_rules(Profile.open(served / "gpt"))[0]
    assert not row["analysis_pending"] and row["top_finding"]["title"] == top.title
    # a restarted server knows it at once, from the disk cache
    restarted = TestClient(create_app(served, analysis_cache=cache))
    row = restarted.get("/api/profiles").json()["profiles"][0]
    assert not row["analysis_pending"] and row["top_finding"]["title"] == top.title


def test_summary_page_does_not_wait_for_the_rules(served, tmp_path, monkeypatch):
    # the profile counts as large: the summary answers without findings, then runs the rules
    # in the background; the findings twin answers with them and the page then carries them
    monkeypatch.setattr(web_app, "LIST_INLINE_EVENTS", 0)
    client = TestClient(create_app(served, analysis_cache=tmp_path / "cache"))
    page = client.get("/api/p/gpt").json()
    assert page["analysis_pending"] and page["findings"] is None and page["findings_total"] is None
    assert page["summary"]["n_events"] == Profile.open(served / "gpt").row_count("events")
    want = [f.title for f in run_rules(Profile.open(served / "gpt"))]
    found = client.get("/api/p/gpt/findings").json()["findings"]
    assert [f["title"] for f in found] == want
    page = client.get("/api/p/gpt").json()
    assert not page["analysis_pending"] and page["findings_total"] == len(want)
    assert [f["title"] for f in page["findings"]] == want[: len(page["findings"])]

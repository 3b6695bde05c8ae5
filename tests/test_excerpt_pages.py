"""The analysis pages of an excerpt that the import does not store (modules, call tree, memory,
source, critical path, what-if, compare; issue 31) are admitted by what they hold
(web/memory.py `pages_bytes`), not by the excerpt's whole analysis (model/footprint.py): they
answer under a ceiling that analysis would not fit beside the server, and one they do not fit
either refuses them with a 503 that says what they need."""

from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient

import neuron_explorer.web.memory as memory
import neuron_explorer.web.service as service
from neuron_explorer.analysis.scoped import store_excerpt
from neuron_explorer.model import Profile, footprint
from neuron_explorer.web.app import create_app

PAGES = ("modules", "calltree", "calltree?by=module", "memory", "source", "critical-path")


@pytest.fixture
def excerpt(imported_profiles, tmp_path, monkeypatch) -> tuple[Profile, Profile]:
    """(the whole, its excerpt): the sample MLP's profile (stacks, counters), cut for a budget
    of 600 KB at 256 B an event and its analysis stored; then weighed at 1 MB an event (the
    whole's analysis ~1.5 GB, the excerpt's ~1 GB) and its pages at 256 KB (~250 MB: the real
    estimates' ratio, scaled up so a sample weighs what a 10 GB trace does)."""
    shutil.copytree(imported_profiles["cpu_mlp"], tmp_path / "p" / "mlp")
    whole = Profile.open(tmp_path / "p" / "mlp")
    with monkeypatch.context() as cut:
        cut.setattr(footprint, "BASE_BYTES", 0)
        cut.setattr(footprint, "EVENT_BYTES", 256)
        part = store_excerpt(whole, 600 << 10, "a test")
    monkeypatch.setattr(footprint, "EVENT_BYTES", 1 << 20)
    monkeypatch.setattr(memory, "PAGE_BASE_BYTES", 0)
    monkeypatch.setattr(memory, "PAGE_EVENT_BYTES", 256 << 10)
    return whole, part


def _client(tmp_path, over_rss: int) -> TestClient:
    # the ceiling over what this process holds already (a long test session holds a lot)
    ceiling = service.rss_bytes() + over_rss
    return TestClient(create_app(tmp_path / "p", analysis_cache=tmp_path / "cache",
                                 max_memory=ceiling))  # fmt: skip


def test_the_pages_not_stored_answer_where_the_excerpts_analysis_would_not_fit(excerpt, tmp_path):
    whole, part = excerpt
    tables, pages = footprint.tables_bytes(part), memory.pages_bytes(part)
    assert 3 * pages < tables  # the ceiling below admits the pages, not the analysis
    client = _client(tmp_path, (pages + tables) // 2)
    page = client.get("/api/p/mlp").json()  # the import's stored analysis: no tables read
    scope = page["scope"]
    assert scope["events"] == part.row_count("events") < whole.row_count("events")
    for twin in PAGES:
        r = client.get(f"/api/p/mlp/{twin}")
        assert r.status_code == 200 and r.json()["scope"] == scope, (twin, r.text[:300])
    src = client.get("/api/p/mlp/source").json()
    top = src["top_lines"][0]
    r = client.get(f"/api/p/mlp/source/{top['file_id']}/lines/{top['line']}")
    assert r.status_code == 200 and r.json()["scope"] == scope, r.text[:300]
    r = client.get("/api/p/mlp/whatif", params={"drop_syncs": "true"})  # (a CPU trace)
    assert r.status_code == 200 and r.json()["scope"] == scope, r.text[:300]
    both = client.get("/api/compare", params={"a": "mlp", "b": "mlp"})
    assert both.status_code == 200 and both.json()["scope_b"] == scope, both.text[:300]
    # the whole profile's timeline beside them, not its excerpt's
    r = client.get("/api/p/mlp/timeline", params={"width_px": 300})
    assert r.status_code == 200 and "scope" not in r.json()


def test_under_a_ceiling_the_pages_do_not_fit_either_they_are_refused_saying_what_they_need(
    excerpt, tmp_path
):
    _, part = excerpt
    pages = memory.pages_bytes(part)
    client = _client(tmp_path, pages // 4)
    assert client.get("/api/p/mlp").status_code == 200  # stored by the import
    for twin in ("modules", "critical-path"):
        r = client.get(f"/api/p/mlp/{twin}")
        assert r.status_code == 503, (twin, r.text[:300])
        assert f"mlp/excerpt ({part.row_count('events'):,} events) needs about " \
               f"{pages >> 20:,} MB" in r.json()["error"]  # fmt: skip

"""The ranks page (/p/NAME/ranks): two ranks of one job side by side, on the committed capture
samples/profiles/ddp_straggler (a 2-rank DDP job whose rank 1 sleeps in each step), through
the real app (its JSON twin) and in Chromium against the real server under uvicorn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from conftest import uvicorn_server
from test_web_browser import _open, browser, context, page  # noqa: F401 - fixtures

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "profiles"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A served folder: the 2-rank job `ddp` and the one-rank capture `one`."""
    root = tmp_path_factory.mktemp("ranks") / "profiles"
    root.mkdir()
    shutil.copytree(SAMPLES / "ddp_straggler", root / "ddp")
    shutil.copytree(SAMPLES / "fallback_float64", root / "one")
    return root


@pytest.fixture(scope="module")
def server(root, tmp_path_factory):
    from neuron_explorer.web.app import create_app

    with uvicorn_server(create_app(root, analysis_cache=tmp_path_factory.mktemp("cache"))) as url:
        yield url


@pytest.mark.slow  # both ranks' analysis: seconds
def test_the_ranks_twin_puts_each_collective_of_both_ranks_side_by_side(server, root):
    from neuron_explorer.analysis.rank_compare import compare_ranks, rank_pair
    from neuron_explorer.model import Profile
    from neuron_explorer.web.views.source import with_file_ids

    doc = httpx.get(f"{server}/api/p/ddp/ranks", timeout=120).json()
    assert doc["ranks"] == [0, 1]
    pair = doc["pair"]
    job = Profile.open(root / "ddp")
    assert pair == json.loads(json.dumps(with_file_ids(rank_pair(job, 0, 1).to_dict())))
    assert pair["comparison"] == json.loads(
        json.dumps(with_file_ids(compare_ranks(job, 0, 1).to_dict()))
    )
    # DDP's gradient all-reduce, once per recorded step: rank 0 waits for the sleeping rank 1
    (ar,) = pair["collectives"]
    assert ar["name"] == "all_reduce" and ar["a"]["calls"] == ar["b"]["calls"] == 3
    assert ar["a"]["transfer_ns"] == ar["b"]["transfer_ns"] > 0  # the same modeled transfer
    assert ar["a"]["wait_ns"] > 10 * max(ar["b"]["wait_ns"], ar["a"]["transfer_ns"])
    events = {
        r[0]: r[1:]
        for r in job.duckdb()
        .execute("SELECT id, rank, start_ns, args FROM events WHERE kind = 'collective'")
        .fetchall()
    }
    assert pair["calls_total"] == len(pair["calls"]) == 3
    for call in pair["calls"]:
        a, b = call["a"], call["b"]
        assert events[a["id"]][0] == 0 and events[b["id"]][0] == 1
        assert a["start_ns"] == b["start_ns"]  # one collective, one instant on both ranks
        assert json.loads(events[a["id"]][2])["wait_ns"] == a["wait_ns"]
        assert call["match"] == f"0/{json.loads(events[a['id']][2])['seq']}"
    waits = [c["a"]["wait_ns"] - c["b"]["wait_ns"] for c in pair["calls"]]
    assert waits == sorted(waits, reverse=True)  # the largest difference first
    # the other order, a missing rank, a profile of one rank
    back = httpx.get(f"{server}/api/p/ddp/ranks?a=1&b=0", timeout=120).json()["pair"]
    assert back["collectives"][0]["a"] == ar["b"] and back["comparison"]["a"].endswith("@rank=1")
    missing = httpx.get(f"{server}/api/p/ddp/ranks?a=0&b=7")
    assert missing.status_code == 404 and "no rank 7" in missing.json()["error"]
    assert httpx.get(f"{server}/api/p/one/ranks").json() == {
        "name": "one",
        "ranks": [0],
        "device_time_modeled": True,  # a neuron capture: the page shows the badge
        "pair": None,
        "every_rank": None,
        "job_ending": None,  # a clean run
    }
    assert doc["device_time_modeled"] is True and pair["device_time_modeled"] is True
    # every rank's busy and wait time over its steps, the wait defined where it is shown
    from neuron_explorer.analysis.collectives import rank_step_waits
    from neuron_explorer.analysis.context import context as analysis_context
    from neuron_explorer.analysis.rank_compare import rank_times

    times = doc["every_rank"]
    assert times == json.loads(json.dumps(rank_times(job).to_dict()))
    assert "HTA" in times["wait_definition"] and "never added up" in times["wait_definition"]
    steps = rank_step_waits(analysis_context(job))
    for t in times["ranks"]:
        mine = steps[t["rank"]]
        assert t["steps"] == len(mine) == 3 and t["step_ns"] == sum(s.dur_ns for s in mine)
        assert t["busy_ns"] + t["wait_ns"] == t["step_ns"]
    zero, one = times["ranks"]
    assert zero["wait_ns"] > 10 * max(one["wait_ns"], 1)  # rank 0 waits for the sleeping rank 1
    assert zero["wait_ns"] <= ar["a"]["wait_ns"]  # its host sat through no more than recorded


@pytest.mark.browser
@pytest.mark.slow  # drives Chromium for seconds
def test_the_ranks_page_shows_the_straggler_and_both_timelines_on_one_clock(server, page):  # noqa: F811
    pair = httpx.get(f"{server}/api/p/ddp/ranks", timeout=120).json()["pair"]
    step = [s for s in pair["comparison"]["steps"]["a"]["per_step"]][0]
    other = [s for s in pair["comparison"]["steps"]["b"]["per_step"]][0]
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/timeline?start_ns=" in r.url else None)
    _open(page, f"{server}/p/ddp/ranks", "ranks-side-by-side", "#cmp-tl-b[data-ready]")
    assert page.locator("a.active").inner_text() == "Ranks"
    assert (
        page.locator("#rank-a").input_value() == "0"
        and page.locator("#rank-b").input_value() == "1"
    )
    rows = page.locator("#rank-calls tbody tr")
    assert rows.count() == 3
    assert all("rank 0 waited for rank 1" in rows.nth(i).inner_text() for i in range(3))
    assert "all_reduce" in page.locator("#rank-collectives tbody").inner_text()
    times = page.locator("#rank-times tbody tr")
    assert times.count() == 2 and times.nth(0).inner_text().split()[0] == "0"
    assert "HTA" in page.locator("#wait-definition").inner_text()
    assert page.locator("#rank-ops tbody tr").count() > 3
    assert page.locator("#rank-kernels tbody tr").count() > 3
    # one time axis for both ranks: both windows start at the earlier rank's step start and
    # span to the later one's end
    start = min(step["start_ns"], other["start_ns"])
    end = max(step["start_ns"] + step["dur_ns"], other["start_ns"] + other["dur_ns"])
    assert float(page.locator("#cmp-tl-status").get_attribute("data-span")) == end - start
    hits = [u for u in asked if f"/p/ddp/timeline?start_ns={start}&end_ns={end}&" in u]
    assert len(hits) == 2, asked
    # each canvas drew only its own rank's lanes
    assert page.locator("#cmp-tl-a").get_attribute("data-ranks") == "0"
    assert page.locator("#cmp-tl-b").get_attribute("data-ranks") == "1"
    # another pair from the picker: the URL carries it
    page.select_option("#rank-a", "1")
    page.select_option("#rank-b", "0")
    page.click("#rank-show")
    page.wait_for_selector("#cmp-tl-b[data-ready]", timeout=30_000)
    assert "a=1&b=0" in page.url
    assert "rank 1 waited for rank 0" not in page.locator("#rank-calls").inner_text()
    assert "rank 0 waited for rank 1" in page.locator("#rank-calls").inner_text()
    assert page.locator("#modeled-badge").is_visible()  # a neuron capture's device times
    _open(page, f"{server}/p/one/ranks", "ranks-one-rank", "#one-rank")
    assert page.locator("#modeled-badge").is_visible()  # one rank, no pair: still modeled
    assert page.errors == [], page.errors

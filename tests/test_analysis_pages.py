"""The page models of neuron_explorer.analysis on the committed sample captures: each is a
frozen dataclass whose to_dict() is plain JSON and is what the web's twin returns (plus its
name and file ids; the timeline and find also on imported tests/data traces); one fact, one
function: the summary's top ops are the operator table's, and its step statistics are the
manifest's steps' (the summary page and the comparison)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import without_file_ids

from neuron_explorer.analysis import summarize
from neuron_explorer.analysis.hotspots import lines_page, modules_page
from neuron_explorer.analysis.lines import line_table, model_line_table, source_page
from neuron_explorer.analysis.operators import operators
from neuron_explorer.analysis.overview import summary_page
from neuron_explorer.analysis.page import PageModel, plain
from neuron_explorer.analysis.steps import profile_steps
from neuron_explorer.model import Profile
from neuron_explorer.web.views.source import file_id, with_file_ids

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "profiles"
NAMES = sorted(p.name for p in SAMPLES.iterdir() if (p / "manifest.json").is_file())
# the two-rank job takes over 5 s a page on a busy machine: in `make test`, not test-fast
SERVED_CASES = ["gpt_train", pytest.param("ddp_straggler", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", NAMES)
def test_top_ops_and_step_statistics_are_one_function_each(name):
    p = Profile.open(SAMPLES / name)
    s = summarize(p)
    host = [o for o in operators(p).operators if o["count"]]
    for table, key in ((s.top_ops_self, "host_self_ns"), (s.top_ops_total, "host_total_ns")):
        want = sorted(host, key=lambda o: (-o[key], o["name"]))[: table.num_rows]
        assert table.to_pylist() == [
            {"name": o["name"], "calls": o["count"], "self_ns": o["host_self_ns"],
             "total_ns": o["host_total_ns"]} for o in want
        ]  # fmt: skip
    steps = profile_steps(p)  # the manifest's steps, as the summary page and compare read them
    assert steps == s.step_stats and steps is not None
    assert steps.count == len(p.manifest.steps) and steps.total_ns == sum(
        x.dur_ns for x in p.manifest.steps
    )
    assert steps.min_ns <= steps.median_ns <= steps.max_ns


@pytest.mark.parametrize("name", SERVED_CASES)
def test_page_models_are_plain_json_and_are_the_web_twins(sample_json, name):
    p = Profile.open(SAMPLES / name)
    pages = {
        "operators": operators(p),
        "modules": modules_page(p),
        "source": source_page(p, line_table_of(p), model_line_table(p), "model"),
        "lines": lines_page(p, "model", top=5),
    }
    for what, page in pages.items():
        assert isinstance(page, PageModel) and dataclasses.is_dataclass(page), what
        doc = page.to_dict()
        assert json.loads(json.dumps(doc)) == doc, what  # plain JSON, no default= needed
    for what, url in (("operators", "operators"), ("modules", "modules"), ("source", "source")):
        twin = sample_json(f"/api/p/{name}/{url}")
        assert twin.pop("name") == name
        assert twin == with_file_ids(json.loads(json.dumps(pages[what].to_dict()))), what
    assert pages["lines"].lines and len(pages["lines"].lines) <= 5


@pytest.mark.parametrize("name", SERVED_CASES)
def test_summary_page_is_the_web_twin(sample_json, served_samples, name):
    from neuron_explorer.analysis.context import context
    from neuron_explorer.analysis.operators import operator_table
    from neuron_explorer.analysis.runner import run_rules
    from neuron_explorer.web.views.overview import devices

    p = Profile.open(served_samples / name)
    found = [f.to_dict() for f in run_rules(p)]
    cols = context(p).cols
    page = summary_page(p, devices(p), summarize(p).to_dict(), found, operator_table(cols),
                        line_table(cols))  # fmt: skip
    twin = sample_json(f"/api/p/{name}")
    assert twin.pop("name") == name
    # the server's own state, not the page's: whether its findings are still being computed
    assert twin.pop("analysis_pending") is False  # a small profile waits for its findings
    doc = json.loads(json.dumps(page.to_dict()))
    # the findings by what they say (one run in the session saw a finding's evidence differ
    # between the server's run and this one: analysis/runner's order, not this page's)
    key = ("rule", "severity", "title", "saving_ns")
    assert [[f[k] for k in key] for f in twin.pop("findings")] == [
        [f[k] for k in key] for f in doc.pop("findings")
    ]
    assert without_file_ids(twin) == doc
    assert twin["steps"]["count"] == len(p.manifest.steps) and twin["findings_total"] == len(found)
    assert all(r["file_id"] == file_id(r["file"]) for r in twin["top_lines"])


def line_table_of(p: Profile):
    from neuron_explorer.analysis.context import context

    return line_table(context(p).cols)


def test_with_file_ids_decorates_every_path_and_nothing_else():
    doc = {"file": "a.py", "rows": [{"file": "b.py", "line": 3}, {"file": None}, 7],
           "nested": ({"file": "c.py"},), "other": {"path": "d.py"}}  # fmt: skip
    out = with_file_ids(doc)
    assert out["file_id"] == file_id("a.py") and out["rows"][0]["file_id"] == file_id("b.py")
    assert "file_id" not in out["rows"][1] and out["nested"][0]["file_id"] == file_id("c.py")
    assert out["other"] == {"path": "d.py"} and len(file_id("a.py")) == 12


def test_plain_turns_records_into_json():
    import pyarrow as pa

    @dataclasses.dataclass(frozen=True)
    class Row:
        n: int
        names: tuple[str, ...]

    assert plain({"t": pa.table({"x": [1, 2]}), "r": (Row(1, ("a",)),)}) == {
        "t": [{"x": 1}, {"x": 2}],
        "r": [{"n": 1, "names": ["a"]}],
    }


def _twins_of_the_timeline(get, p: Profile, name: str) -> None:
    """The timeline's whole view, a zoomed window and a find, each the page model plus name."""
    from neuron_explorer.analysis.search import search
    from neuron_explorer.analysis.timeline import build_index, first_view, timeline_page, window

    idx = build_index(p)
    for query in ("", "&start_ns={s}&end_ns={e}"):
        s, e = first_view(idx)
        if query:  # the middle tenth
            s, e = s + (e - s) * 9 // 20, s + (e - s) * 11 // 20
        twin = get(f"/api/p/{name}/timeline?width_px=1000" + query.format(s=s, e=e))
        assert twin.pop("name") == name
        model = timeline_page(p, idx, window(p, idx, s, e, 1000))
        assert twin == json.loads(json.dumps(model.to_dict())), (name, query)
        # a view of every event takes lanes and depths from the index: as a window read would
        unindexed = dataclasses.replace(idx, event_lane=idx.event_lane[:0])
        whole = (idx.start_ns, idx.end_ns, 1000)
        assert window(p, idx, *whole) == window(p, unindexed, *whole), name
        assert twin["window"]["events"] == sum(twin["window"]["rects"]["count"]) > 0
        url = f"/api/p/{name}/timeline?width_px=1000&window_only=true" + query.format(s=s, e=e)
        keep = ("device_time_modeled", "window")  # a zoom's answer: the window alone
        assert get(url) == {"name": name, **{k: twin[k] for k in keep}}, (name, query)
    for q, regex in (("mm", False), ("^aten::", True), ("no such name", False)):
        twin = get(f"/api/p/{name}/search?q={q}&regex={str(regex).lower()}&limit=20")
        assert twin.pop("name") == name
        assert twin == json.loads(json.dumps(search(p, q, regex, 20).to_dict())), (name, q)


@pytest.mark.parametrize("name", ["gpt_train", "ddp_straggler"])
def test_timeline_and_find_are_the_web_twins_on_captures(sample_json, served_samples, name):
    _twins_of_the_timeline(sample_json, Profile.open(served_samples / name), name)


@pytest.mark.slow  # three imports served: about 6 s
def test_timeline_and_find_are_the_web_twins_on_imported_traces(imported_profiles, tmp_path):
    from fastapi.testclient import TestClient

    from neuron_explorer.web.app import create_app

    folder = imported_profiles["alexnet"].parent  # every imported trace, side by side
    client = TestClient(create_app(folder, analysis_cache=tmp_path / "cache"))

    def get(url: str) -> dict:
        r = client.get(url)
        assert r.status_code == 200, (url, r.text[:300])
        return r.json()

    for name in ("alexnet", "nccl", "cpu_mlp"):
        _twins_of_the_timeline(get, Profile.open(imported_profiles[name]), name)


def test_the_profile_list_rows_are_the_page_models(sample_json, served_samples):
    """Each row of /api/profiles is analysis.overview.profile_row plus the server's state;
    its `steps` is the summary page's step statistics without per_step."""
    from neuron_explorer.analysis.overview import devices, profile_row

    listed = sample_json("/api/profiles")
    rows = {r["name"]: r for r in listed["profiles"]}
    assert len(rows) == len(list(served_samples.iterdir()))
    for name, row in rows.items():
        p = Profile.open(served_samples / name)
        pending = row.pop("analysis_pending")  # the list analyses for at most 1 s in all
        model = profile_row(name, p, devices(p), None).to_dict()  # top_finding: None
        top, row["top_finding"] = row["top_finding"], None
        assert row == json.loads(json.dumps(model)), name
        assert (top is None) if pending else top["title"]  # the server's first finding
        steps = json.loads(json.dumps(profile_steps(p).to_dict()))
        assert row["steps"] == {**steps, "per_step": []} and row["steps"]["count"] > 0

"""The call tree of host time (analysis/calltree.py and /api/p/NAME/calltree) on a real CPU trace
recorded with stacks and modules (tests/data/kineto-cpu-stacks), a real neuron capture
(samples/profiles/gpt_train) and an imported GPU trace; the events of one source line that the
timeline outlines (/api/p/NAME/source/FILE_ID/lines/N/events); and the timeline's find by the
names' dictionary; each checked against plain SQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from neuron_explorer.analysis.calltree import call_tree
from neuron_explorer.importers import import_traces
from neuron_explorer.model import Profile
from neuron_explorer.web.app import create_app
from neuron_explorer.web.views.source import file_id

ROOT = Path(__file__).resolve().parent.parent
STACKS_TRACE = ROOT / "tests/data/kineto-cpu-stacks/gpt2_cpu_stacks_modules.pt.trace.json.gz"
CAPTURE = ROOT / "samples/profiles/gpt_train"
# each host span's own time, as the tree defines it, in plain SQL: steps and the profiler's span
# are see-through (not nodes); everything else counts its duration minus its host children's
SELF_SQL = """SELECT sum(greatest(e.dur_ns - coalesce(c.kids, 0), 0)) FROM events e
    LEFT JOIN (SELECT parent_id, sum(dur_ns) AS kids FROM events WHERE layer = 'host'
               GROUP BY parent_id) c ON c.parent_id = e.id
    WHERE e.layer = 'host' AND e.kind NOT IN ('step', 'other')"""


@pytest.fixture(scope="module")
def profiles(tmp_path_factory, imported_profiles) -> dict[str, Profile]:
    out = tmp_path_factory.mktemp("calltree")
    stacks = import_traces([STACKS_TRACE], out / "stacks")
    return {"stacks": Profile.open(stacks), "capture": Profile.open(CAPTURE),
            "alexnet": Profile.open(imported_profiles["alexnet"])}  # fmt: skip


def _children(tree):
    kids: dict[int, list] = {n.id: [] for n in tree.nodes}
    for n in tree.nodes:
        if n.parent >= 0:
            kids[n.parent].append(n)
    return kids


def _ancestors(tree, node):
    by_id = {n.id: n for n in tree.nodes}
    while node.parent >= 0:
        node = by_id[node.parent]
        yield node


@pytest.mark.parametrize("name", ["stacks", "capture", "alexnet"])
@pytest.mark.parametrize("by", ["stack", "module"])
def test_the_tree_adds_up_to_the_host_time_of_the_profile(profiles, name, by):
    p = profiles[name]
    tree = call_tree(p, by)
    expected = p.duckdb().execute(SELF_SQL).fetchall()[0][0]
    assert tree.total_ns == expected > 0
    assert tree.nodes[0].total_ns == tree.total_ns and tree.dropped_nodes == 0
    kids = _children(tree)
    for n in tree.nodes:  # total = self + the callees' totals, at every node
        assert n.total_ns == n.self_ns + sum(c.total_ns for c in kids[n.id]), n
        assert n.parent < n.id  # parents first
    assert sum(n.self_ns for n in tree.nodes) == tree.total_ns


def test_python_frames_of_a_trace_recorded_with_stacks_are_the_callers(profiles):
    tree = call_tree(profiles["stacks"])
    assert tree.has_stacks and tree.has_modules
    root_kids = [n for n in tree.nodes if n.parent == 0]
    assert [n.name for n in root_kids] == ["record.py(16): <module>"]  # the script's top frame
    addmm = [n for n in tree.nodes if n.name == "aten::addmm"]
    assert addmm
    # every addmm is called from nn.Linear's forward (or Conv1D's, in GPT-2), through Python frames
    for n in addmm:
        frames = [a for a in _ancestors(tree, n) if a.kind == "python"]
        assert frames and frames[-1].name == "record.py(16): <module>"
        assert any(a.file and a.file.endswith(("linear.py", "pytorch_utils.py")) for a in frames), n
    f = next(n for n in tree.nodes if n.kind == "python")
    assert f.file and f.line and f.name == f"{f.file}({f.line}): {f.name.split('): ', 1)[1]}"


def test_a_captures_ops_sit_under_the_stacks_of_their_launches(profiles):
    tree = call_tree(profiles["capture"])
    frames = [n for n in tree.nodes if n.kind == "frame"]
    user = [n for n in frames if n.file == "samples/gpt_train.py"]
    assert user, "the capture's user frames are in the tree"
    under_user = [n for n in tree.nodes if n.kind == "op" and any(
        a.file == "samples/gpt_train.py" for a in _ancestors(tree, n))]  # fmt: skip
    assert sum(n.self_ns for n in under_user) > 0.2 * tree.total_ns


def test_by_module_the_model_holds_the_time_of_its_modules_spans(profiles):
    p = profiles["stacks"]
    tree = call_tree(p, "module")
    model = next(n for n in tree.nodes if n.parent == 0 and n.name == "(model)")
    sql = SELF_SQL + " AND e.module IS NOT NULL"
    assert model.total_ns == p.duckdb().execute(sql).fetchall()[0][0]
    names = {n.name for n in tree.nodes if n.kind == "module"}
    first = p.duckdb().execute("SELECT min(module) FROM events WHERE module <> ''").fetchall()[0][0]
    assert first.split(".")[0] in names


def test_only_the_largest_nodes_are_kept_with_their_ancestors(profiles):
    full = call_tree(profiles["stacks"])
    small = call_tree(profiles["stacks"], max_nodes=50)
    ids = {n.id for n in small.nodes}
    assert 50 <= len(small.nodes) < len(full.nodes)
    assert small.dropped_nodes == len(full.nodes) - len(small.nodes)
    assert all(n.parent in ids for n in small.nodes if n.parent >= 0)
    assert small.nodes[0].total_ns == full.nodes[0].total_ns


@pytest.fixture(scope="module")
def client(tmp_path_factory, profiles):
    import shutil

    root = tmp_path_factory.mktemp("served")
    for name in ("stacks", "capture"):
        shutil.copytree(profiles[name].path, root / name)
    return TestClient(create_app(root, analysis_cache=tmp_path_factory.mktemp("cache")))


def test_the_json_twin_is_the_model_with_links_into_the_source_view(client, profiles):
    r = client.get("/api/p/capture/calltree")
    assert r.status_code == 200, r.text[:300]
    d = r.json()
    model = call_tree(profiles["capture"]).to_dict()
    assert [n["name"] for n in d["nodes"]] == [n["name"] for n in model["nodes"]]
    assert d["total_ns"] == model["total_ns"] and d["by"] == "stack"
    linked = [n for n in d["nodes"] if n["file_id"]]
    assert linked and all(n["file_id"] == file_id(n["file"]) for n in linked)
    assert client.get(f"/api/p/capture/source/{linked[0]['file_id']}").status_code == 200
    assert client.get("/api/p/capture/calltree?by=module").json()["by"] == "module"
    assert client.get("/api/p/capture/calltree?by=nothing").status_code == 422
    assert client.get("/p/capture/calltree").status_code == 200


def test_a_lines_events_are_every_event_at_it(client, profiles):
    con = profiles["capture"].duckdb()
    path, line, n = con.execute(
        "SELECT src_file, src_line, count(*) FROM events WHERE src_file IS NOT NULL "
        "GROUP BY ALL ORDER BY 3 DESC LIMIT 1"
    ).fetchall()[0]
    expected = con.execute(
        "SELECT count(*) FROM events WHERE (src_file = $f AND src_line = $l) OR "
        "(model_file = $f AND model_line = $l) OR stack_id IN "
        "(SELECT stack_id FROM stacks WHERE file = $f AND line = $l)",
        {"f": path, "l": line},
    ).fetchall()[0][0]
    d = client.get(f"/api/p/capture/source/{file_id(path)}/lines/{line}/events?limit=7").json()
    assert d["total"] == expected >= n and d["truncated"] == (expected > 7)
    assert len(d["matches"]) == min(7, expected)
    starts = [m["start_ns"] for m in d["matches"]]
    assert starts == sorted(starts)
    assert client.get("/api/p/capture/source/000000000000/lines/1/events").status_code == 404


@pytest.mark.parametrize("name", ["stacks", "capture", "alexnet"])
@pytest.mark.parametrize(("q", "regex"), [("mm", False), ("^aten::(add|mul)", True), ("CONV", False),
                                          ("no such name", False)])  # fmt: skip
def test_find_by_the_name_dictionary_equals_the_sql_path(profiles, name, q, regex):
    """The timeline's find matches each distinct name of the Parquet dictionary once and finds
    the events by code; it answers exactly what the plain SQL path answers."""
    from neuron_explorer.web.views.search import search_events

    p = profiles[name]
    con = p.duckdb()
    fast = search_events(con, q, regex, 50, profile=p)
    assert fast == search_events(con, q, regex, 50)
    where = "regexp_matches(name, $q)" if regex else "contains(lower(name), lower($q))"
    total = con.execute(f"SELECT count(*) FROM events WHERE {where}", {"q": q}).fetchall()[0][0]
    assert fast["total"] == total and len(fast["matches"]) == min(50, total)

"""The flame graph of a timeline selection (/api/p/NAME/span/flame) on real profiles: each box's
time and count equal what the events table gives when every event overlapping the span is
walked up its parent chain by hand, the boxes nest, and a span with nothing in it is empty."""

from __future__ import annotations

from collections import defaultdict

import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from test_web_support import build_root

from neuron_explorer.web.app import create_app


@pytest.fixture(scope="module")
def root(tmp_path_factory, imported_profiles):
    return build_root(tmp_path_factory.mktemp("web"), imported_profiles)


@pytest.fixture(scope="module")
def client(root, tmp_path_factory):
    return TestClient(create_app(root, analysis_cache=tmp_path_factory.mktemp("cache")))


def _by_hand(events: dict[str, list], s: int, e: int) -> dict[tuple[str, ...], tuple[int, int]]:
    """Each nesting path's (time inside [s, e), events) from the events table's columns."""
    inside = {}
    for i, st, d, parent, name in zip(
        events["id"],
        events["start_ns"],
        events["dur_ns"],
        events["parent_id"],
        events["name"],
        strict=True,
    ):
        if d > 0 and st < e and st + d > s:
            inside[i] = (parent, name or "", min(st + d, e) - max(st, s))
    out: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0])
    for i, (_, name, t) in inside.items():
        path, j = [name], inside[i][0]
        while j in inside:
            path.append(inside[j][1])
            j = inside[j][0]
        acc = out[tuple(reversed(path))]
        acc[0] += t
        acc[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.parametrize("name", ["gpt", "alexnet"])
def test_the_flame_graph_sums_the_events_table(client, root, name):
    cols = ["id", "start_ns", "dur_ns", "parent_id", "name"]
    events = pq.read_table(root / name / "events.parquet", columns=cols).to_pydict()
    lo, hi = (
        min(events["start_ns"]),
        max(s + d for s, d in zip(events["start_ns"], events["dur_ns"], strict=True)),
    )
    s, e = lo + (hi - lo) // 3, lo + (hi - lo) // 2  # a span that cuts events at both ends
    d = client.get(f"/api/p/{name}/span/flame", params={"start_ns": s, "end_ns": e}).json()
    want = _by_hand(events, s, e)
    nodes = d["nodes"]
    assert nodes[0]["parent"] == -1 and d["total_ns"] == nodes[0]["total_ns"]
    assert d["total_ns"] == sum(t for k, (t, _) in want.items() if len(k) == 1) > 0
    paths = {0: ()}
    for n in nodes[1:]:
        paths[n["id"]] = paths[n["parent"]] + (n["name"],)
        assert (n["total_ns"], n["count"]) == want[paths[n["id"]]], paths[n["id"]]
        assert n["depth"] == len(paths[n["id"]])
    assert len(nodes) - 1 + d["dropped"] == len(want)  # every path is a box or counted as left out
    kids = defaultdict(int)
    for n in nodes[1:]:
        kids[n["parent"]] += n["total_ns"]
    for n in nodes[1:]:
        assert n["self_ns"] == max(0, n["total_ns"] - kids[n["id"]])


def test_an_empty_span_has_only_its_root(client, root):
    starts = pq.read_table(root / "gpt" / "events.parquet", columns=["start_ns"]).column(0)
    s = min(starts.to_pylist()) - 10_000  # before the first event
    d = client.get("/api/p/gpt/span/flame", params={"start_ns": s, "end_ns": s + 5_000}).json()
    assert d["total_ns"] == 0 and len(d["nodes"]) == 1 and d["dropped"] == 0


def test_a_span_beyond_int64_is_refused(client):
    r = client.get("/api/p/gpt/span/flame", params={"start_ns": 0, "end_ns": 2**63})
    assert r.status_code == 422


def test_a_box_of_lanes_counts_only_their_events(client, root):
    """An area over some lanes (Perfetto's area selection): the totals and the flame graph hold
    only those lanes' events, counted by hand from the events table."""
    lanes = client.get("/api/p/gpt/timeline?width_px=500").json()["lanes"]
    host = next(x for x in lanes if x["layer"] == "host" and x["depth"] > 1)
    dev = next(x for x in lanes if x["layer"] == "device")
    cols = ["id", "start_ns", "dur_ns", "parent_id", "name", "rank", "layer", "device", "track"]
    t = pq.read_table(root / "gpt" / "events.parquet", columns=cols).to_pylist()
    key = lambda r: (r["rank"], str(r["layer"]), r["device"], str(r["track"]))  # noqa: E731
    picked = {key(host), key(dev)}
    rows = [r for r in t if key(r) in picked]
    lo = min(r["start_ns"] for r in t)
    hi = max(r["start_ns"] + r["dur_ns"] for r in t)
    s, e = lo + (hi - lo) // 3, lo + (hi - lo) // 2
    on = {"start_ns": s, "end_ns": e, "lanes": f"{host['lane']},{dev['lane']}"}
    events = {c: [r[c] for r in rows] for c in cols}
    want = _by_hand(events, s, e)
    d = client.get("/api/p/gpt/span/flame", params=on).json()
    assert d["total_ns"] == sum(t for k, (t, _) in want.items() if len(k) == 1) > 0
    assert len(d["nodes"]) - 1 + d["dropped"] == len(want)
    inside = [r for r in rows if (r["start_ns"] < e and r["start_ns"] + r["dur_ns"] > s)
              or (r["dur_ns"] == 0 and s <= r["start_ns"] < e)]  # fmt: skip
    totals = client.get("/api/p/gpt/span", params=on).json()
    assert totals["events"] == len(inside) > 0
    assert {(x["device"], x["track"]) for x in totals["lanes"]} <= {(dev["device"], dev["track"])}
    everything = client.get("/api/p/gpt/span", params={"start_ns": s, "end_ns": e}).json()
    assert everything["events"] > totals["events"]
    assert client.get("/api/p/gpt/span", params={**on, "lanes": "99999"}).status_code == 404
    assert client.get("/api/p/gpt/span", params={**on, "lanes": "1;2"}).status_code == 422

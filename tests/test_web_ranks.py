"""A job of several ranks in the web UI's JSON: each rank's lanes, and each rank's side of a
collective linked to the other ranks' (samples/profiles/ddp_straggler, a real 2-rank capture)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from neuron_explorer.web.app import create_app

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "profiles" / "ddp_straggler"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(SAMPLE, root / "ddp")
    return TestClient(create_app(root, analysis_cache=tmp_path_factory.mktemp("cache")))


def test_each_rank_has_its_lanes_and_its_collective_lane(client):
    t = client.get("/api/p/ddp/timeline").json()
    lanes = {(lane["rank"], lane["track"]) for lane in t["lanes"]}
    assert (0, "CC") in lanes and (1, "CC") in lanes


def test_a_collective_links_to_the_same_collective_on_the_other_rank(client):
    q = client.get(
        "/api/p/ddp/sql",
        params={"q": "SELECT id, rank, start_ns, dur_ns, args FROM events WHERE kind = "
                     "'collective' AND layer = 'device' ORDER BY rank, start_ns"},
    ).json()  # fmt: skip
    res = q["result"]
    rows = [dict(zip(res["columns"], r, strict=True)) for r in res["rows"]]
    mine = next(
        r for r in rows if r["rank"] == 0 and json.loads(r["args"])["collective"] == "all_reduce"
    )
    seq = json.loads(mine["args"])["seq"]
    ev = client.get(f"/api/p/ddp/events/{mine['id']}").json()
    peers = [f for f in ev["flows"] if f["kind"] == "collective"]
    assert [p["rank"] for p in peers] == [1]
    other = next(r for r in rows if r["id"] == peers[0]["id"])
    assert json.loads(other["args"])["seq"] == seq
    # one modeled clock: both sides end at the same instant
    assert other["start_ns"] + other["dur_ns"] == mine["start_ns"] + mine["dur_ns"]

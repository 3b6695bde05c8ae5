"""Issue 31, the timeline and find on the whole of a profile too big for the server: the index
streamed in record batches equals the in-memory one, a window reduced batch by batch equals
window(), find a row group at a time equals the plain SQL find, on real traces (tests/data),
two-rank captures and a profile with strays; and a real server whose ceiling is below a
profile's whole need answers its timeline, windows and find, and refuses what cannot fit."""

from __future__ import annotations

import json

import hostile_sizes
import pytest
from test_analysis_profiles import real, sample
from test_reliability_hostile import KeptAlive, peak_mb, serve
from test_web_security import far_events

from neuron_explorer.analysis.search import search_sql
from neuron_explorer.analysis.search_stream import NameCounter, name_counts, search_bounded
from neuron_explorer.analysis.timeline import first_view, window
from neuron_explorer.analysis.timeline_index import build_index
from neuron_explorer.analysis.timeline_stream import build_index_streamed
from neuron_explorer.model.profile import Profile

PROFILES = ["alexnet", "nccl", "ns_resolution", "sample:gpt_train", "sample:ddp_straggler"]


def _profile(name: str, tmp_path) -> Profile:
    if name == "far":  # two events at 9e18 ns: the whole view fits the others (`fit`)
        return Profile.open(far_events(real("alexnet").path, tmp_path / "far"))
    return sample(name[7:]) if name.startswith("sample:") else real(name)


def _small_batch(p: Profile) -> int:
    """Batches of 97 rows, or 25 batches in all on the larger traces (a test under ~5 s)."""
    return max(97, p.row_count("events") // 25)


def _same_index(a, b) -> None:
    assert a.lanes.equals(b.lanes)  # lanes in order, their events and nesting depth
    assert a.long_threshold_ns == b.long_threshold_ns
    assert a.long_events.to_pylist() == b.long_events.to_pylist()
    assert (a.start_ns, a.end_ns, a.fit, a.steps) == (b.start_ns, b.end_ns, b.fit, b.steps)


@pytest.mark.parametrize("name", [*PROFILES, "far"])
def test_the_streamed_index_is_the_in_memory_one(name, tmp_path):
    """nccl (27k events) and ns_resolution (ties at the 20,001st longest) exercise the running
    top-k; ddp_straggler's two ranks the merge in start order; `far` the strays."""
    p = _profile(name, tmp_path)
    whole = build_index(p)
    for batch in (_small_batch(p), 4096):
        streamed = build_index_streamed(p, batch)
        _same_index(whole, streamed)
        assert not len(streamed.event_lane)  # no per-event arrays: windows read row groups
        # each row's lane and depth (what a window reads instead of the lane columns, parents)
        assert streamed.row_lane.tolist() == whole.event_lane.tolist()
        assert streamed.row_depth.tolist() == whole.event_depth.tolist()
    if name == "far":
        assert whole.fit is not None and whole.fit[2] == 2


@pytest.mark.parametrize("name", [*PROFILES, "far"])
def test_a_window_reduced_in_batches_is_window(name, tmp_path):
    """The whole view, a third and a thin slice, at 1500 px and at 300 px with 50 rectangles
    (the bucket doubles), in small batches, on both indexes (the streamed one with and without
    its rows' lanes and depths): window()'s answer."""
    p = _profile(name, tmp_path)
    whole, streamed = build_index(p), build_index_streamed(p, 500)
    lanes_read = build_index_streamed(p, 500, rows=False)  # each window reads lanes, parents
    assert len(streamed.row_lane) == p.row_count("events") and not len(lanes_read.row_lane)
    s, e = first_view(whole)
    spans = [(s, e), (s + (e - s) // 3, s + (e - s) // 2), (s + (e - s) // 10, s + (e - s) // 9)]
    for ws, we in spans:
        for width, most in ((1500, 4000), (300, 50)):
            want = window(p, whole, ws, we, width, most).to_dict()
            for idx in (whole, streamed, lanes_read):
                got = window(p, idx, ws, we, width, most, batched=True, batch_size=_small_batch(p))
                assert got.to_dict() == want, (ws, we, width, most)
            for idx in (streamed, lanes_read):
                assert window(p, idx, ws, we, width, most).to_dict() == want
    assert want["events"] > 0


@pytest.mark.parametrize("name", ["alexnet", "nccl", "sample:gpt_train", "sample:ddp_straggler"])
def test_find_a_row_group_at_a_time_is_the_sql_find(name, tmp_path):
    p = _profile(name, tmp_path)
    con = p.duckdb()
    counts = name_counts(p)
    want = con.execute("SELECT CAST(name AS VARCHAR) AS n, count(*) FROM events "
                       "WHERE name IS NOT NULL GROUP BY 1 ORDER BY 1").fetchall()  # fmt: skip
    assert [(r["name"], r["events"]) for r in counts.to_pylist()] == want
    counter = NameCounter()  # counted by the streamed index's pass, in batches of any size
    build_index_streamed(p, _small_batch(p), names=counter)
    assert counter.table().equals(counts)
    for q, regex in (
        ("mm", False),
        ("^aten::(add|mul)", True),
        ("NCCL", False),
        ("no such", False),
    ):
        for limit in (7, 1000):  # fewer than the matches (stops early), and all of them
            assert search_bounded(p, counts, q, regex, limit) == search_sql(con, q, regex, limit)


def test_the_service_admits_the_timeline_and_find_of_a_profile_by_what_they_read(tmp_path):
    """The same path in process, on a small profile, the ceiling set before each call to what
    the process holds (trimmed) plus three quarters of the profile's whole need: the whole is refused
    (the operator table: 503), the index is streamed, the first view and a window are
    window()'s, find is the SQL find."""
    from neuron_explorer.web.memory import EVENT_BYTES, OverMemory, rss_bytes, trim
    from neuron_explorer.web.service import Service

    root = tmp_path / "profiles"
    hostile_sizes.base_profile(root / "big", 100_000)
    svc = Service(root, tmp_path / "cache", max_memory=1 << 40)
    p = svc.store.open("big")
    whole = p.footer_rows["events"] * EVENT_BYTES + p.footer_bytes

    def ceiling() -> None:  # after a trim, as admission does when it would refuse
        trim()
        svc.memory.limit = rss_bytes() + whole * 3 // 4

    ceiling()
    with pytest.raises(OverMemory, match="big"):
        svc.ops("big")
    ceiling()
    idx = svc.index("big")
    assert not len(idx.event_lane)  # streamed
    ref = build_index(p)
    _same_index(ref, idx)
    ceiling()
    s, e = first_view(ref)
    assert svc.first_window("big", 1500).to_dict() == window(p, ref, s, e, 1500).to_dict()
    # another browser's width gets the same view: each width would be another pass over all
    assert svc.first_window("big", 820) is svc.first_window("big", 1500)
    ceiling()
    lo, hi = s + (e - s) // 3, s + (e - s) // 2
    assert svc.window("big", lo, hi, 800).to_dict() == window(p, ref, lo, hi, 800).to_dict()
    ceiling()
    want = search_sql(p.duckdb(), "kernel_", False, 100).to_dict()
    assert svc.find("big", "kernel_", False, 100) == want and want["total"] > 100
    # a second server on the same disk cache reads the index and the whole view back
    again = Service(root, tmp_path / "cache", max_memory=1 << 40)
    again.memory.limit = 0  # nothing may be read in batches: all from the cache
    kept = again.index("big")
    _same_index(ref, kept)
    assert kept.row_lane.tolist() == ref.event_lane.tolist()  # each row's lane and depth
    assert kept.row_depth.tolist() == ref.event_depth.tolist()
    assert again.first_window("big", 1500).to_dict() == window(p, ref, s, e, 1500).to_dict()
    assert again.name_counts("big").equals(name_counts(p))  # counted by the index's pass


@pytest.mark.sweep  # ~25 s: a 400,000-event profile written, then served
def test_a_server_under_its_ceiling_shows_the_timeline_and_find_of_a_bigger_profile(tmp_path):
    """`--max-memory 400M` and a 400,000-event profile that needs about 300 MB held whole on
    top of a server holding ~130 MB: its timeline (index streamed), windows and find answer
    200, as the small profile's do; its operators page (the whole profile) is refused, 503;
    the process stays under the ceiling."""
    root = tmp_path / "profiles"
    hostile_sizes.base_profile(root / "good")
    hostile_sizes.base_profile(root / "big", 400_000)
    with serve(root, tmp_path, "--max-memory", "400M") as (hostport, pid):
        c = KeptAlive(hostport)
        status, body = c.get("/api/p/big/operators")
        assert status == 503 and "400 MB ceiling (--max-memory)" in json.loads(body)["error"]
        for name in ("big", "good"):
            status, body = c.get(f"/api/p/{name}/timeline?width_px=1000")
            assert status == 200, body[:300]
            d = json.loads(body)
            assert d["window"]["events"] == sum(ln["events"] for ln in d["lanes"]) > 0
            s, e = d["extent"]["start_ns"], d["extent"]["end_ns"]
            for lo, hi in ((s, e), (s + (e - s) // 3, s + (e - s) // 3 + (e - s) // 50)):
                status, body = c.get(f"/api/p/{name}/timeline?start_ns={lo}&end_ns={hi}")
                assert status == 200 and json.loads(body)["window"]["events"] > 0, body[:300]
            status, body = c.get(f"/api/p/{name}/search?q=kernel_")
            assert status == 200 and json.loads(body)["total"] > 0, body[:300]
        peak = peak_mb(pid)
    print(f"\nserver peak under a 400 MB ceiling: {peak:.0f} MB")
    assert peak < 400


def test_work_admitted_at_once_counts_what_the_other_was_admitted():
    """Two heavy requests at once (a browser's view beside the warm-up's) are each admitted
    against the ceiling less what the other's running work was admitted, not only what RSS
    shows before either allocates: the second waits for the first to end, and is refused if
    it does not end in time."""
    import threading

    from neuron_explorer.web.memory import MemoryCeiling, OverMemory, rss_bytes, trim

    mb = 1 << 20
    trim()  # what earlier tests left, given back first: a refusal's own trim must not free it
    ceiling = MemoryCeiling(rss_bytes() + 300 * mb, lambda keep: None)
    admitted, done = threading.Event(), threading.Event()

    def first() -> None:
        with ceiling.running():
            ceiling.admit(200 * mb, "the first view")
            admitted.set()
            done.wait(30)

    worker = threading.Thread(target=first)
    worker.start()
    assert admitted.wait(30)
    ceiling.wait_s = 0.2  # the first runs on: the second is refused once it has waited
    with pytest.raises(OverMemory, match="a window needs about 200 MB"):
        ceiling.admit(200 * mb, "a window")
    ceiling.wait_s = 30
    threading.Timer(0.3, done.set).start()  # the first ends while the second waits
    ceiling.admit(200 * mb, "a window")
    worker.join(30)
    ceiling.admit(200 * mb, "a second window")  # outside `running`, nothing stays reserved


def test_running_work_counts_once_what_it_holds_already():
    """What running work was admitted and already holds is in RSS: it is not counted again
    (the pyramid's build, half a minute on a 10 GB trace's profile, held its rows and its
    reservation, so a window beside it waited and was refused though it fit)."""
    import threading

    import numpy as np

    from neuron_explorer.web.memory import MemoryCeiling, OverMemory, rss_bytes, trim

    mb = 1 << 20
    trim()
    ceiling = MemoryCeiling(rss_bytes() + 400 * mb, lambda keep: None)
    ceiling.wait_s = 0.2
    held, done = threading.Event(), threading.Event()

    def build() -> None:
        with ceiling.running():
            ceiling.admit(200 * mb, "the pyramid")
            rows = np.ones(200 * mb // 8)  # what it was admitted, held (touched: in RSS)
            held.set()
            done.wait(30)
            del rows

    worker = threading.Thread(target=build)
    worker.start()
    try:
        assert held.wait(30)
        ceiling.admit(150 * mb, "a window")  # 200 held + 150 fits; 200 twice + 150 did not
        with pytest.raises(OverMemory, match="a wider window needs about 260 MB"):
            ceiling.admit(260 * mb, "a wider window")  # what it holds is counted once
    finally:
        done.set()
        worker.join(30)

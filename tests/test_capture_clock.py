"""One clock (explorer/capture/clock.py): simulator time is cut out of the host timeline."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from explorer.capture.clock import Cut, HostClock, merge_cuts
from explorer.capture.link import innermost_parents, step_of


def test_times_shift_by_the_simulator_time_of_earlier_calls():
    # Two runtime calls: 80 of 100 ns inside the backend replaced by 10 ns, then 100 ns by 0.
    clock = HostClock([Cut(100, 200, 80, 10), Cut(300, 400, 100, 0)])
    got = clock.map([0, 100, 150, 200, 250, 300, 400, 500]).tolist()
    assert got == [0, 100, 115, 130, 180, 230, 230, 330]
    assert clock.total_removed_ns == 170


def test_a_call_nested_in_another_is_not_cut_twice():
    merged = merge_cuts([Cut(100, 200, 100, 20), Cut(120, 150, 30, 5)])
    assert merged == [Cut(100, 200, 100, 20)]
    assert HostClock(merged).map([200]).tolist() == [120]


def test_no_cuts_is_the_identity():
    t = np.array([0, 5, 10**12])
    assert HostClock([]).map(t).tolist() == t.tolist()


def test_long_runs_do_not_overflow():
    # A 20 s cut: (t - start) * new_span would overflow int64 in integer arithmetic.
    clock = HostClock([Cut(0, 20 * 10**9, 10 * 10**9, 0)])
    assert clock.map([20 * 10**9]).tolist() == [10 * 10**9]


@given(
    st.lists(
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**4), st.integers(0, 10**4),
                  st.integers(0, 10**4)),
        max_size=20,
    ),
    st.lists(st.integers(0, 2 * 10**6), min_size=2, max_size=50),
)  # fmt: skip
def test_mapping_keeps_order_and_never_adds_time(raw_cuts, times):
    cuts = [Cut(s, s + d, min(r, d), m) for s, d, r, m in raw_cuts]
    clock = HostClock(cuts)
    times = np.sort(np.array(times, dtype=np.int64))
    mapped = clock.map(times)
    assert (np.diff(mapped) >= 0).all()  # nesting and order survive
    merged = merge_cuts(cuts)
    added = sum(max(c.model_ns - c.real_ns, 0) for c in merged)
    assert (mapped <= times + added).all()


def test_innermost_parent_is_the_tightest_enclosing_event_on_the_same_track():
    track = np.array(["a", "a", "a", "b", "a"], dtype=object)
    start = np.array([0, 10, 12, 11, 50])
    end = np.array([100, 40, 20, 30, 60])
    parents = innermost_parents(track, start, end, np.ones(5, dtype=bool))
    assert parents.tolist() == [-1, 0, 1, -1, 0]


def test_step_of_finds_the_step_holding_each_time():
    steps = step_of(np.array([5, 15, 25, 40]), np.array([10, 20]), np.array([20, 30]),
                    np.array([3, 4]))  # fmt: skip
    assert steps.tolist() == [-1, 3, 4, -1]

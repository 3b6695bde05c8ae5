"""One clock (explorer/capture/clock.py): simulator time is cut out of the host timeline."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from neuron_explorer.capture.clock import Call, HostClock
from neuron_explorer.vocab.intervals import innermost_parents, step_of


def _calls(spans):
    """Calls made one after another, with the running cut the runtime would have recorded."""
    cut, out = 500, []  # 500 ns were cut before the window: the mapping is relative to it
    for start, end, model in spans:
        out.append(Call(start, end, model, cut))
        cut += (end - start) - model
    return out


def test_times_shift_by_the_simulator_time_of_earlier_calls():
    # 100 ns in the backend modeled as 10 ns, then 100 ns modeled as 0.
    clock = HostClock(_calls([(100, 200, 10), (300, 400, 0)]))
    got = clock.map([0, 100, 150, 200, 250, 300, 400, 500]).tolist()
    assert got == [0, 100, 105, 110, 160, 210, 210, 310]
    assert clock.total_removed_ns == 190


def test_a_zero_length_call_inserts_its_modeled_cost():
    # A sync recorded at one instant that models a 40 ns wait for the device.
    clock = HostClock(_calls([(100, 100, 40)]))
    assert clock.map([50, 99, 100, 150]).tolist() == [50, 99, 140, 190]


def test_no_calls_is_the_identity():
    t = np.array([0, 5, 10**12])
    assert HostClock([]).map(t).tolist() == t.tolist()


def test_long_runs_keep_nanoseconds():
    clock = HostClock(_calls([(0, 20 * 10**9, 0)]))
    assert clock.map([20 * 10**9 + 7]).tolist() == [7]


@given(
    st.lists(st.tuples(st.integers(0, 10**4), st.integers(0, 10**4), st.integers(0, 10**4)),
             max_size=20),
    st.lists(st.integers(0, 3 * 10**5), min_size=2, max_size=50),
)  # fmt: skip
def test_mapping_keeps_order_and_matches_the_runtime_clock(gaps, times):
    spans, t = [], 0
    for gap, real, model in gaps:
        spans.append((t + gap, t + gap + real, model))
        t += gap + real
    calls = _calls(spans)
    clock = HostClock(calls)
    times = np.sort(np.array(times, dtype=np.int64))
    assert (np.diff(clock.map(times)) >= 0).all()  # nesting and order survive
    for c, (gap, _, _) in zip(calls, gaps, strict=True):
        if gap == 0:
            continue  # no real time between this call and the last to check in
        # Just before each call, the map agrees with the runtime's modeled clock.
        assert clock.map([c.start_ns - 1]).tolist() == [c.start_ns - 1 - (c.cut_before_ns - 500)]


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


def test_a_round_trip_cut_after_a_call_is_taken_right_after_it():
    # 100 ns modeled as 10, and 30 ns more cut (the wrapper's return), then a call at 300.
    calls = [Call(100, 200, 10, 500), Call(300, 310, 0, 500 + 90 + 30)]
    got = HostClock(calls).map([200, 215, 230, 300]).tolist()
    # the 30 ns right after the span collapse onto its end; user code after it keeps slope 1
    assert got == [110, 110, 110, 180]


def test_a_round_trip_longer_than_the_gap_stops_at_the_next_call():
    calls = [Call(100, 200, 10, 500), Call(220, 230, 0, 500 + 90 + 50)]
    got = HostClock(calls).map([200, 210, 220]).tolist()
    assert got == [110, 110, 110]

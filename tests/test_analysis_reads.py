"""The analysis's bounded reads give what the plain joins give: a graph's events read between
their first and last start (windows.read_events), and an event in a launch-bound step by an
ASOF join with the steps' merged spans (facts.launch_bound_spans)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from neuron_explorer.analysis import intervals
from neuron_explorer.analysis.context import context
from neuron_explorer.analysis.rules.launch_bound import DISPATCH, KERNELS, LAUNCH
from neuron_explorer.analysis.windows import _COLUMNS, LAG_NS, read_events, windows_of
from neuron_explorer.model.profile import Profile

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "profiles"

# the read as it was: one join, then every column of every event for the kept ids
_PLAIN = """
WITH host AS (
    SELECT x.id, x.rank, x.kind, x.flow_id FROM events x SEMI JOIN graph_windows w
        ON x.rank = w.rank AND x.start_ns >= w.s AND x.start_ns < w.e
    WHERE x.layer = 'host' AND x.kind IN ('runtime', 'sync', 'copy', 'op', 'annotation')),
near AS MATERIALIZED (
    SELECT x.id, x.rank, x.track, x.start_ns, x.flow_id FROM events x SEMI JOIN graph_windows w
        ON x.rank = w.rank AND (x.step = w.step OR x.start_ns BETWEEN w.lo AND w.hi)
    WHERE x.layer = 'device' AND x.kind IN ('kernel', 'gpu_kernel', 'gpu_memcpy', 'gpu_memset',
        'collective', 'sync')),
launched AS (SELECT DISTINCT rank, flow_id FROM host
    WHERE kind = 'runtime' AND flow_id IS NOT NULL),
own AS (
    SELECT n.rank, n.track, n.start_ns FROM near n SEMI JOIN launched l
        ON l.rank = n.rank AND l.flow_id = n.flow_id
    UNION ALL
    SELECT n.rank, n.track, n.start_ns FROM near n JOIN graph_windows w
        ON w.own AND w.rank = n.rank AND n.start_ns >= w.s AND n.start_ns < w.e
    WHERE n.flow_id IS NULL),
last AS (SELECT rank, track, max(start_ns) AS t FROM own GROUP BY rank, track),
kept AS (
    SELECT id FROM host
    UNION ALL
    SELECT n.id FROM near n JOIN last ON last.rank = n.rank
        AND last.track IS NOT DISTINCT FROM n.track AND n.start_ns <= last.t)
SELECT {cols} FROM events SEMI JOIN kept ON events.id = kept.id ORDER BY rank, start_ns, id"""


def _plain_read(profile: Profile, chosen: list) -> list[dict]:
    con = profile.duckdb()
    ranks = [int(w[0]) for w in chosen]
    last_of = {r: i for i, r in enumerate(ranks)}
    con.register("graph_windows", pa.table({
        "rank": pa.array(ranks, pa.int64()), "step": pa.array([w[1] for w in chosen], pa.int64()),
        "s": pa.array([w[2] for w in chosen], pa.int64()),
        "e": pa.array([w[3] for w in chosen], pa.int64()),
        "lo": pa.array([s - (e - s) for _, _, s, e in chosen], pa.int64()),
        "hi": pa.array([e + max(4 * (e - s), LAG_NS) for _, _, s, e in chosen], pa.int64()),
        "own": pa.array([last_of[r] == i for i, r in enumerate(ranks)]),
    }))  # fmt: skip
    cur = con.execute(_PLAIN.format(cols=", ".join(_COLUMNS)))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _steps(profile: Profile) -> list[list]:
    by_step: dict = defaultdict(list)
    for w in windows_of(profile):
        by_step[w[1]].append(w)
    return list(by_step.values())


@pytest.mark.parametrize("name", ["pipeline_imbalance", "ddp_straggler", "gpt_train"])
def test_each_steps_read_equals_the_plain_join_on_samples(name):
    profile = Profile.open(SAMPLES / name)
    steps = _steps(profile)
    assert steps
    for chosen in steps:
        got = read_events(profile, chosen)
        assert got and got == _plain_read(profile, chosen)


def test_each_steps_read_equals_the_plain_join_on_a_cuda_trace(imported_profiles):
    profile = Profile.open(imported_profiles["nccl"])
    steps = _steps(profile)
    assert len(steps) > 1
    for chosen in steps:
        assert read_events(profile, chosen) == _plain_read(profile, chosen)


@pytest.mark.parametrize("name", ["gpt_train", "pipeline_imbalance"])
def test_launch_bound_spans_hold_what_the_steps_hold(name):
    profile = Profile.open(SAMPLES / name)  # held: the context keeps it weakly
    ctx = context(profile)
    assert ctx.one("SELECT count(*) AS n FROM launch_bound_steps")["n"] > 0
    plain = DISPATCH.replace(
        "id IN (SELECT x.id FROM ev x ASOF JOIN launch_bound_spans s ON x.rank = s.rank "
        "AND x.start_ns >= s.s WHERE x.start_ns < s.e AND x.layer = 'host' AND x.kind = 'op')",
        "EXISTS (SELECT 1 FROM launch_bound_steps s WHERE s.rank = ev.rank "
        "AND ev.start_ns >= s.start_ns AND ev.start_ns < s.start_ns + s.dur_ns)",
    )
    assert plain != DISPATCH
    sql = "SELECT id FROM ev WHERE {} ORDER BY id"
    got = ctx.rows(sql.format(DISPATCH))
    assert got and got == ctx.rows(sql.format(plain))
    kernels = ctx.one(
        f"""SELECT count(DISTINCT {LAUNCH}) AS n FROM ev k JOIN launch_bound_steps s
        ON k.rank = s.rank AND k.start_ns >= s.start_ns AND k.start_ns < s.start_ns + s.dur_ns
        WHERE {KERNELS}"""
    )
    assert kernels["n"] > 0
    assert kernels == ctx.one(
        f"""SELECT count(DISTINCT {LAUNCH}) AS n FROM ev k ASOF JOIN launch_bound_spans s
        ON k.rank = s.rank AND k.start_ns >= s.s WHERE {KERNELS} AND k.start_ns < s.e"""
    )


def test_an_asof_join_with_merged_spans_holds_what_overlapping_windows_hold():
    """Windows that overlap, touch, nest, are empty or negative: an ASOF join with their
    merged spans finds each time in one exactly when a range join does."""
    rng = np.random.default_rng(7)
    rank = rng.integers(0, 3, 300).astype(np.int32)
    start = rng.integers(0, 10_000, 300)
    dur = rng.integers(-20, 400, 300)
    steps = pa.table({"rank": rank, "start_ns": start, "dur_ns": dur})
    positive = steps.filter(pa.compute.greater(steps["dur_ns"], 0))
    spans = intervals.merge(
        pa.table({"rank": positive["rank"], "s": positive["start_ns"],
                  "e": pa.compute.add(positive["start_ns"], positive["dur_ns"])}), ["rank"]
    )  # fmt: skip
    points = pa.table({"id": np.arange(5000), "rank": rng.integers(0, 4, 5000).astype(np.int32),
                       "t": rng.integers(-100, 10_600, 5000)})  # fmt: skip
    con = duckdb.connect()
    for n, t in (("steps", steps), ("spans", spans), ("points", points)):
        con.register(n, t)
    plain = con.execute(
        "SELECT id FROM points p WHERE EXISTS (SELECT 1 FROM steps s WHERE s.rank = p.rank "
        "AND p.t >= s.start_ns AND p.t < s.start_ns + s.dur_ns) ORDER BY id"
    ).fetchall()
    asof = con.execute(
        "SELECT p.id FROM points p ASOF JOIN spans s ON p.rank = s.rank AND p.t >= s.s "
        "WHERE p.t < s.e ORDER BY p.id"
    ).fetchall()
    assert 0 < len(plain) < 5000
    assert asof == plain

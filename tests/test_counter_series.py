"""The counter track's series (analysis/memory.counter_series): each bucket's min, max and last,
and each counter's peak, against plain SQL over the samples, ties included: the GPT-2 sample's
allocator samples several values at one timestamp, so `last` and the peak's time must say which
(the greatest value at the latest time; the peak's first time), or two runs can differ."""

from __future__ import annotations

from conftest import ROOT

from neuron_explorer.analysis.memory import counter_series
from neuron_explorer.model import Profile

GPT = ROOT / "samples" / "profiles" / "gpt_train"


def test_every_bucket_and_peak_is_what_plain_sql_says_ties_included():
    con = Profile.open(GPT).duckdb()
    series = counter_series(con)
    assert series
    ties = 0
    for k in series:
        key = "rank = ? AND CAST(track AS VARCHAR) = ? AND CAST(name AS VARCHAR) = ?"
        args = [k["rank"], k["track"], k["name"]]
        first, peak = con.execute(
            f"SELECT min(ts_ns), max(value) FROM counters WHERE {key}", args
        ).fetchone()
        assert k["peak"] == peak
        first_peak = f"SELECT min(ts_ns) FROM counters WHERE {key} AND value = ?"
        assert k["peak_ts_ns"] == con.execute(first_peak, [*args, peak]).fetchone()[0]
        want = con.execute(
            f"WITH s AS (SELECT (ts_ns - ?) // ? AS b, ts_ns, value FROM counters WHERE {key}), "
            "t AS (SELECT b, max(ts_ns) AS t1 FROM s GROUP BY b) "
            "SELECT s.b, min(s.ts_ns), min(s.value), max(s.value), "
            "max(s.value) FILTER (WHERE s.ts_ns = t.t1), "
            "count(DISTINCT s.value) FILTER (WHERE s.ts_ns = t.t1) "
            "FROM s JOIN t USING (b) GROUP BY s.b ORDER BY s.b",
            [first, k["bucket_ns"], *args],
        ).fetchall()
        assert k["ts_ns"] == [r[1] for r in want]
        assert k["min"] == [r[2] for r in want] and k["max"] == [r[3] for r in want]
        assert k["last"] == [r[4] for r in want]
        ties += sum(r[5] > 1 for r in want)
    assert ties  # the case this checks is in the data

"""`diff` and its `--gate` compare one step time (analysis/steps.py `job_steps`): each whole
step of a job as long as its slowest rank, the median over steps. On the shipped two-rank
pipeline captures the summary's median over rank-steps (36.58 ms over 6) is not it; diff's
headline, its JSON, its breakdown and the gate all say the same 33.57 ms over 3 steps."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from test_analysis_profiles import sample

from neuron_explorer.analysis.compare import diff
from neuron_explorer.analysis.gate import per_step, verdict
from neuron_explorer.analysis.steps import job_steps, profile_steps

BASE, NEW = "pipeline_balanced", "pipeline_imbalance"


def _slowest_per_step(profile) -> list[int]:
    """Straight from the manifest: each step's longest rank."""
    worst: dict[int, int] = {}
    for s in profile.manifest.steps:
        worst[s.step] = max(worst.get(s.step, 0), s.dur_ns)
    return [worst[k] for k in sorted(worst)]


def test_diff_and_the_gate_give_the_median_of_each_steps_slowest_rank():
    a, b = sample(BASE), sample(NEW)
    doc = diff(a, b)
    gate = verdict(a, b, 0.05)
    for side, profile, median in (("a", a, gate.base_median_ns), ("b", b, gate.new_median_ns)):
        job = doc.job_steps[side]
        assert job is not None and job.ranks == 2 and job.count == 3
        assert job.median_ns == median == float(np.median(_slowest_per_step(profile)))
        assert per_step(profile) == _slowest_per_step(profile) == [ns for *_, ns in job.per_step]
        # the summary's statistics are over rank-steps (steady state): a different figure
        assert doc.steps[side].count == 6 and doc.steps[side].median_ns != job.median_ns
    assert doc.step_ns_delta == round(gate.new_median_ns - gate.base_median_ns)
    # the breakdown is that median step's slowest rank, part by part: its parts add up to it
    assert sum(r["a"] for r in doc.breakdown) == round(doc.job_steps["a"].median_ns)


def test_diff_text_and_json_say_which_median():
    a, b = (str(sample(n).path) for n in (BASE, NEW))
    run = [sys.executable, "-m", "neuron_explorer", "diff", a, b]
    text = subprocess.run([*run, "--gate", "5%"], capture_output=True, text=True, timeout=300)
    out = " ".join(text.stdout.split())
    assert "median step A 33.569 ms (3 whole steps, each its slowest of 2 ranks)" in out
    assert "B 80.453 ms (3 whole steps, each its slowest of 2 ranks)" in out
    assert "as long as its slowest rank" in out
    doc = json.loads(subprocess.run([*run, "--gate", "5%", "--json"], capture_output=True,
                                    text=True, timeout=300).stdout)  # fmt: skip
    assert doc["job_steps"]["a"]["median_ns"] == doc["gate"]["base_median_ns"] == 33568690
    assert doc["job_steps"]["b"]["median_ns"] == doc["gate"]["new_median_ns"]
    assert doc["job_steps"]["a"]["per_step"][0] == [2, 1, 33568690]  # step 2: rank 1 slowest


def test_one_rank_is_its_steps_and_a_step_after_a_recompile_is_whole():
    """The compiled sample's step 4 follows the recompile (6.6 s): it is a whole step, not a
    stub cut short (a stub is under half of every other step of its rank)."""
    stats = profile_steps(sample("gpt_compile"))
    assert stats is not None and stats.partial_last_steps == ()
    job = job_steps(stats)
    assert job is not None and job.count == 3 and job.ranks == 1
    assert job.median_ns == stats.median_ns == sorted(s.dur_ns for s in stats.per_step)[1]


def test_summary_of_a_job_names_the_step_diff_compares():
    proc = subprocess.run([sys.executable, "-m", "neuron_explorer", "summary",
                           str(sample(BASE).path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    out = " ".join(proc.stdout.split())
    assert "median 36.582 ms" in out  # every rank's steps, steady state
    assert "as diff and its gate compare): median 33.569 ms over 3 whole steps" in out

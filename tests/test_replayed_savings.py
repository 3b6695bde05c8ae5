"""Every finding's saving is a replay (issue 26), on the captured samples and the Kineto traces
of tests/data: each replayed finding's saving is the drop of its steps, each replayed on its
own dependency graph here with the change the finding names; what each rule's change holds is
checked against the profile it came from; the replay of all changes together is what analyze
states as the total, never past the steps; and a saving that is not replayed says so."""

from __future__ import annotations

import pytest
from test_analysis_profiles import real, sample

from neuron_explorer.analysis import run_rules
from neuron_explorer.analysis.context import context
from neuron_explorer.analysis.depgraph import build_graph
from neuron_explorer.analysis.replay import Change, step_ns
from neuron_explorer.analysis.replay_saving import CHANGES
from neuron_explorer.analysis.runner import findings_report
from neuron_explorer.model.profile import Profile

SAMPLES = ("gpt_train", "gpt_compile", "fallback_float64", "cnn_dataloader", "ddp_straggler",
           "pipeline_imbalance")  # fmt: skip
TRACES = ("amd", "nccl", "cpu_only", "alexnet")
# rules whose change cannot be replayed honestly: an upper bound, labelled (docs/rules.md)
BOUNDED = ("collective-outliers", "collective-share", "straggler", "pipeline-bubbles",
           "step-time-outliers")  # fmt: skip
NO_SAVING = ("float64-downcast", "hbm-capacity")  # correctness findings


def profile_of(name: str) -> Profile:
    return real(name) if name in TRACES else sample(name)


def drop(profile: Profile, change: Change, steps: list[int | None]) -> int:
    """The steps' drop with `change`, each step replayed on a graph built here."""
    known = {s.step for s in profile.manifest.steps}
    total = 0
    for s in steps:
        if known and s not in known:
            continue  # events outside every step shorten no step
        graph = build_graph(profile, s)
        total += max(step_ns(graph) - step_ns(graph, change), 0)
    return total


@pytest.mark.parametrize("name", SAMPLES + TRACES)
def test_each_saving_is_its_replayed_drop_and_all_together_stay_within_the_steps(name):
    p = profile_of(name)
    report = findings_report(p)
    findings = report.findings
    changes = CHANGES.get(context(p), {})
    for f in findings:
        assert f.saving_ns <= report.total_step_ns, f.rule
        if f.rule in NO_SAVING:
            assert f.saving_ns == 0 and not f.replayed and not f.bound
        elif f.rule in BOUNDED:
            # said less: an upper bound, and why no replay holds it
            assert not f.replayed and (f.bound or f.saving_ns == 0) and "not replayed" in f.bound
        else:
            assert f.replayed and not f.bound, f.rule
            change, steps = changes[(f.rule, f.title)]
            assert len(steps) <= 12  # sampled beyond 12: not the case here
            assert f.saving_ns == drop(p, change, steps), f.rule
    replayed = [f for f in findings if f.replayed]
    if replayed:
        total = report.replayed_total_ns
        assert total is not None and total <= report.total_step_ns
        assert total <= sum(f.saving_ns for f in replayed) + len(replayed)
        assert total >= max(f.saving_ns for f in replayed) * 0.98
    else:
        assert report.replayed_total_ns is None


def test_launch_bound_replays_half_the_hosts_dispatch_in_its_steps():
    # gpt_train: eager, launch-bound; the change removes half of each outermost host op of
    # its steps (the kernels kept), so the step shortens by what the host gives back
    p = sample("gpt_train")
    (f,) = [f for f in run_rules(p) if f.rule == "launch-bound"]
    change, steps = CHANGES[context(p)][(f.rule, f.title)]
    con = p.duckdb()
    ops = con.execute(
        """SELECT e.rank, e.start_ns, e.dur_ns FROM events e LEFT JOIN events o
        ON o.id = e.parent_id WHERE e.layer = 'host' AND e.kind = 'op' AND e.step IS NOT NULL
        AND (o.kind IS NULL OR o.kind <> 'op') ORDER BY e.rank, e.start_ns"""
    ).fetchall()
    assert sorted(change.drop_host) == sorted((r, s, s + round(d * 0.5)) for r, s, d in ops)
    assert not change.durations and steps == [2, 3, 4]
    removed = sum(e - s for _, s, e in change.drop_host)
    # the device works ~3 ms of the 15 ms: the host's time removed comes back almost whole
    assert 0.9 * removed <= f.saving_ns <= removed


def test_fp32_matmul_replays_each_matmul_at_its_predicted_bf16_time():
    from neuron_explorer.analysis.bf16 import estimate
    from neuron_explorer.analysis.rules.fp32_matmul import FP32

    p = sample("gpt_train")
    (f,) = [f for f in run_rules(p) if f.rule == "fp32-matmul"]
    ctx = context(p)
    change, _ = CHANGES[ctx][(f.rule, f.title)]
    with ctx.lock:
        est = estimate(ctx, FP32, f.evidence.metrics["speedup"])
    assert f.replayed.startswith("these 117 matmuls at their predicted bf16 time in a bf16")
    assert len(change.durations) == 117 == est.matmuls
    # the replayed times add up to the device-time prediction the title and metrics give
    before = dict(p.duckdb().execute(
        "SELECT id, dur_ns FROM events WHERE id IN (SELECT unnest(?))", [list(change.durations)]
    ).fetchall())  # fmt: skip
    cut = sum(before[i] - d for i, d in change.durations.items())
    assert abs(cut - f.evidence.metrics["model_net_ns"]) <= 117
    # a launch-bound step: 0.16 ms less device time shortens it by almost nothing
    assert f.saving_ns < 0.05 * cut


def test_small_dma_replays_its_kernels_without_the_exposed_small_transfers():
    p = sample("fallback_float64")
    (f,) = [f for f in run_rules(p) if f.rule == "small-dma"]
    change, _ = CHANGES[context(p)][(f.rule, f.title)]
    m = f.evidence.metrics
    kinds = dict(p.duckdb().execute(
        "SELECT id, kind FROM events WHERE id IN (SELECT unnest(?))", [list(change.durations)]
    ).fetchall())  # fmt: skip
    assert set(kinds.values()) == {"kernel"}  # the transfers' own kernels get shorter
    before = dict(p.duckdb().execute(
        "SELECT id, dur_ns FROM events WHERE id IN (SELECT unnest(?))", [list(change.durations)]
    ).fetchall())  # fmt: skip
    cut = sum(before[i] - d for i, d in change.durations.items())
    assert 0 < cut <= m["exposed_ns"]
    assert f.saving_ns <= cut


def test_cpu_fallback_replays_its_fallbacks_copies_and_syncs_gone():
    p = sample("fallback_float64")
    (f,) = [f for f in run_rules(p) if f.rule == "cpu-fallback"]
    change, _ = CHANGES[context(p)][(f.rule, f.title)]
    kinds = [r[0] for r in p.duckdb().execute(
        "SELECT kind FROM events WHERE id IN (SELECT unnest(?))", [list(change.drop_syncs)]
    ).fetchall()]  # fmt: skip
    assert kinds and set(kinds) == {"sync"}
    assert "an upper bound" in f.replayed  # the op on the device counted free
    assert 0 < f.saving_ns <= f.evidence.metrics["fallback_ns"]


def test_analyze_prints_each_replayed_change_the_bounds_and_the_total(capsys):
    from neuron_explorer.cli import main

    assert main(["analyze", str(sample("ddp_straggler").path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "replayed: the host's time in these" in out
    assert "saves at most ~" in out and "(an upper bound: " in out and "; not replayed: " in out
    assert "replayed change(s) together save ~" in out

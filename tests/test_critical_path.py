"""The dependency graph, its replay and its critical path (analysis/depgraph.py, replay.py,
critical_path.py, whatif.py): a hand-built step whose answer is known, the captured samples
(replaying no change gives every event back), an imported CUDA trace (HTA's critical-path test
trace, AlexNet on an A100) and the commands `critical-path` and `whatif`."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from test_analysis_profiles import _TMP, SPEC, _Events, real, sample

from neuron_explorer.analysis.critical_path import critical_path, path_of
from neuron_explorer.analysis.depgraph import build_graph
from neuron_explorer.analysis.replay import replay
from neuron_explorer.analysis.whatif import whatif
from neuron_explorer.errors import ExplorerError
from neuron_explorer.model.io import ProfileWriter
from neuron_explorer.model.manifest import Manifest, Step
from neuron_explorer.model.profile import Profile

US = 1_000
MS = 1_000_000
SAMPLES = ("gpt_train", "gpt_compile", "cnn_dataloader", "ddp_straggler", "pipeline_imbalance",
           "fallback_float64")  # fmt: skip
ALEXNET_WINDOW = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"


def known_step() -> Profile:
    """One 5 ms step whose critical path is known: 1 ms of host work, launch A (10 us), kernel
    A (2 ms, from 1.1 ms), kernel B queued behind it (1 ms), `.item()` waiting for B and
    0.1 ms of copy after it, then 0.8 ms of host work to the step's end."""
    out = _TMP / "known-step"
    if out.exists():
        return Profile.open(out)
    ev = _Events()
    src = {"src_file": "/work/user/train.py", "src_func": "step"}
    ev.add(kind="step", name="ProfilerStep#0", start_ns=0, dur_ns=5 * MS, step=0)
    ev.add(kind="op", name="aten::mm", op_name="aten::mm", start_ns=1 * MS, dur_ns=10 * US, step=0)
    ev.add(kind="runtime", name="launch", op_name="aten::mm", start_ns=1 * MS, dur_ns=10 * US,
           step=0, flow_id=1, src_line=10, **src)  # fmt: skip
    ev.add(layer="device", kind="kernel", name="mm", op_name="aten::mm", start_ns=1100 * US,
           dur_ns=2 * MS, step=0, flow_id=1, src_line=10, **src)  # fmt: skip
    ev.add(kind="runtime", name="launch", op_name="aten::add", start_ns=1500 * US, dur_ns=10 * US,
           step=0, flow_id=2, src_line=11, **src)  # fmt: skip
    ev.add(layer="device", kind="kernel", name="add", op_name="aten::add", start_ns=3100 * US,
           dur_ns=1 * MS, step=0, flow_id=2, src_line=11, **src)  # fmt: skip
    ev.add(kind="sync", name=".item()", op_name="aten::_local_scalar_dense", start_ns=2 * MS,
           dur_ns=2200 * US, step=0, args={"wait_ns": 2100 * US, "direction": "d2h"},
           src_line=12, **src)  # fmt: skip
    ev.add(kind="op", name="Optimizer.step#SGD.step", start_ns=4200 * US, dur_ns=800 * US, step=0)
    with ProfileWriter(out) as w:
        w.write_events(ev.columns())
        w.commit(Manifest(source="capture", origin_unix_ns=time.time_ns(),
                          device_spec=dict(SPEC), steps=(Step(0, 0, 0, 5 * MS),)))  # fmt: skip
    return Profile.open(out)


def test_known_step_critical_path():
    page = critical_path(known_step())
    assert page.step_ns == page.path_ns == 5 * MS
    assert page.by_category["device compute"] == 3 * MS  # kernel A, then B behind it
    assert page.by_category["host"] == 2 * MS  # 1 ms before, launch + latency, copy, 0.8 ms
    on_path = [(s.label, s.category, s.dur_ns) for s in page.segments]
    assert on_path == [
        ("(host, outside any op)", "host", 1 * MS),
        ("aten::mm (launch)", "host", 10 * US),
        ("aten::mm (launch latency)", "host", 90 * US),
        ("aten::mm", "device compute", 2 * MS),
        ("aten::add", "device compute", 1 * MS),
        (".item()", "host", 100 * US),  # its copy after the device is done
        ("Optimizer.step#SGD.step", "host", 800 * US),
    ]
    ops = {(o.label, o.category): o for o in page.ops}
    # kernel A at twice the speed: B moves up 1 ms, and so does the sync and the host after it
    assert ops[("aten::mm", "device compute")].saving_if_2x_ns == 1 * MS
    assert ops[("aten::add", "device compute")].saving_if_2x_ns == 500 * US
    edges = page.edges
    assert edges == {"program": 2, "launch": 2, "queue": 1, "sync": 1}


def test_known_step_whatif():
    prof = known_step()
    assert whatif(prof, ["aten::mm=2"]).after_ns == 4 * MS
    assert whatif(prof, ["mm=4"]).after_ns == 3500 * US  # a kernel's own name works too
    # the host no longer waits: its last 0.8 ms runs from 2 ms; the device ends at 4.1 ms
    dropped = whatif(prof, drop_syncs=True)
    assert dropped.after_ns == 4100 * US and dropped.events_changed == 1
    both = whatif(prof, ["aten::mm=2", "aten::add=2"], drop_syncs=True)
    assert both.after_ns == 2800 * US  # host work 2.0 + 0.8 ms now outlasts the device
    assert both.saving_ns == both.before_ns - both.after_ns <= both.before_ns


@pytest.mark.parametrize("name", SAMPLES)
def test_replaying_no_change_gives_the_capture_back(name):
    graph = build_graph(sample(name))
    sched = replay(graph)
    moved = [n.name for n in graph.nodes
             if (sched.start[n.index], sched.end[n.index]) != (n.start_ns, n.end_ns)]  # fmt: skip
    assert moved == []
    page = path_of(graph, name)
    assert sum(page.by_category.values()) == page.path_ns > 0
    assert page.path_ns == page.step_ns  # the path covers the step, nothing twice


def test_straggler_path_runs_through_the_slow_rank():
    """ddp_straggler: rank 1 sleeps before its all-reduce; rank 0 waits in c10d::wait, so rank
    0's critical path crosses to rank 1 through the collective."""
    page = critical_path(sample("ddp_straggler"), rank=0)
    on_rank1 = sum(s.dur_ns for s in page.segments if s.rank == 1)
    assert on_rank1 > 0.8 * page.step_ns
    assert any(s.category == "transfer" for s in page.segments)
    # made faster, the straggler's all-reduce would not shorten rank 0's step: it waits on rank 1
    assert whatif(sample("ddp_straggler"), ["all_reduce=2"]).saving_ns < 10 * US


def test_cuda_trace_graph_and_path():
    """AlexNet on an A100 (HTA's critical-path test trace), the measured forward HTA's test
    takes: launches, stream queues, stream syncs and a cudaStreamWaitEvent between streams."""
    prof = real("alexnet")
    graph = build_graph(prof, annotation=ALEXNET_WINDOW, instance=1)
    sched = replay(graph)
    assert all((sched.start[n.index], sched.end[n.index]) == (n.start_ns, n.end_ns)
               for n in graph.nodes)  # fmt: skip
    page = path_of(graph, "alexnet")
    assert page.path_ns == page.step_ns == 36_356_000  # the annotation's span
    assert {"launch", "queue", "program", "sync"} <= set(page.edges)
    assert page.by_category["device compute"] > 0
    top = next(o for o in page.ops if o.saving_if_2x_ns is not None)
    assert 0 < top.saving_if_2x_ns <= top.dur_ns
    assert page.edges["stream_wait"] >= 1
    outer = critical_path(prof, annotation=ALEXNET_WINDOW, instance=0)  # holds instance 1
    assert outer.step_ns == outer.path_ns == 79_678_000


def test_a_whole_cuda_trace_is_host_bound_before_its_first_kernel():
    """The same trace without steps or an annotation, as `critical-path PROFILE` takes it: the
    host spends 30 s (CUDA's start) before the first copy. cudaStreamSynchronize's device-side
    "Stream Sync" rows hold no queue, so the copies after them are not waiting on 30 s of
    "earlier steps' device work" (no earlier steps exist in a whole trace)."""
    prof = real("alexnet")
    page = critical_path(prof)
    assert page.label == "whole trace" and page.path_ns == page.step_ns
    busy = (
        prof.duckdb()
        .execute("SELECT sum(dur_ns) FROM events WHERE layer = 'device' AND kind <> 'sync'")
        .fetchone()[0]
    )
    device = sum(v for k, v in page.by_category.items() if k != "host")
    assert 0 < device <= busy < 0.01 * page.step_ns
    assert all(s.edge != "earlier" for s in page.segments)
    assert page.by_category["host"] > 0.99 * page.step_ns


def _earlier_pieces(page) -> int:
    return sum(s.dur_ns for s in page.segments if s.edge == "earlier")


def test_waiting_behind_earlier_steps_counts_only_their_work():
    """A kernel queued behind another step's work waits for that work's run, not from the
    step's start: on HTA's trimmed trace_compare trace, step 1009's last kernel runs right
    after step 1010's copies (under 1 ms of work), 157 ms into the step; on ns_resolution the
    GPU is a step behind, and the step's first kernels wait for the previous step's 88 ms."""
    page = critical_path(real("compare_base"))
    assert page.label == "step 1009" and page.path_ns == page.step_ns > 150 * MS
    foreign = (
        real("compare_base")
        .duckdb()
        .execute(
            "SELECT sum(dur_ns) FROM events WHERE layer = 'device' AND rank = 1 AND step = 1010"
        )
        .fetchone()[0]
    )
    assert 0 < _earlier_pieces(page) <= foreign < 1 * MS
    assert page.by_category["host"] > 0.99 * page.step_ns
    behind = critical_path(real("ns_resolution"))
    assert 80 * MS < _earlier_pieces(behind) < behind.step_ns / 2
    assert behind.by_category["host"] < 0.01 * behind.step_ns


def test_a_rocm_trace_defaults_to_a_whole_step():
    """The ROCm (MI250) trace ends with a 49 us ProfilerStep#2 the profiler stopped inside: the
    default step is the whole one (the median of the whole steps), its hipLaunchKernel ->
    kernel flows in the graph, not the stub's host gap."""
    prof = real("amd")
    page = critical_path(prof)
    assert page.label == "step 1" and page.step_ns == page.path_ns > 9 * MS
    assert page.edges["launch"] >= 1 and len(page.ops) > 5
    assert critical_path(prof, step=2).step_ns < 100 * US  # still there when asked for


def test_stream_wait_event_edge():
    graph = build_graph(real("alexnet"), annotation="[param|pytorch.model.alex_net|0|0|0]")
    waits = [e for e in graph.edges if e.kind == "stream_wait"]
    assert waits and all(graph.nodes[e.src].track != graph.nodes[e.dst].track for e in waits)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_explorer", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.mark.sweep  # the CLI over a capture: ~10 s quiet (default suite < 15 min)
def test_cli_critical_path_and_whatif():
    prof = str(known_step().path)
    doc = json.loads(_cli("critical-path", prof, "--json").stdout)
    assert doc["path_ns"] == 5 * MS and doc["label"] == "step 0"
    text = _cli("critical-path", prof).stdout
    assert "device compute" in text and "aten::mm" in text
    w = json.loads(_cli("whatif", prof, "--speedup", "aten::mm=2", "--json").stdout)
    assert (w["before_ns"], w["after_ns"], w["saving_ns"]) == (5 * MS, 4 * MS, 1 * MS)
    bad = _cli("whatif", prof, "--speedup", "aten::mm")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--speedup" in bad.stderr
    none = _cli("whatif", prof, "--speedup", "aten::conv=2")
    assert none.returncode == 2 and "no device work" in none.stderr
    step = _cli("critical-path", prof, "--step", "7")
    assert step.returncode == 2 and "no step 7" in step.stderr


def test_chip_swap_relowers_each_kernel():
    prof = sample("gpt_train")
    same = whatif(prof, chip="trn2")  # the chip it was captured for: nothing moves
    assert same.after_ns == same.before_ns and same.events_changed > 100
    kernels = (
        prof.duckdb()
        .execute("SELECT count(*) FROM events WHERE kind = 'kernel' AND step = 2")
        .fetchall()[0][0]
    )
    assert whatif(prof, chip="trn3").events_changed == kernels  # every kernel of the step


def test_chip_swap_lowers_the_sample_s_compiled_kernels_again():
    """The shipped compiled sample keeps the graph of every NEFF (graphs.parquet): the chip swap
    lowers its fused groups again with the other chip's spec and keeps none at their captured
    time (tests/test_chip_swap.py checks the times against fresh captures on each chip)."""
    prof = sample("gpt_compile")
    swap = whatif(prof, chip="trn3")
    step = int(swap.label.split()[-1])
    kernels, graph = (
        prof.duckdb()
        .execute(
            "SELECT count(*) FILTER (WHERE shapes IS NOT NULL OR op_name LIKE 'neuron_graph%'),"
            " count(*) FILTER (WHERE op_name LIKE 'neuron_graph%') FROM events"
            f" WHERE layer = 'device' AND kind = 'kernel' AND step = {step}"
        )
        .fetchone()
    )
    assert graph > 0
    (chip,) = [c for c in swap.changes if "lowered for trn3" in c]
    assert chip.startswith(f"{swap.events_changed} kernels lowered for trn3 (captured on trn2)")
    assert f"{graph} of them compiled graphs' fused groups" in chip and "kept" not in chip
    assert graph <= swap.events_changed <= kernels
    # an aten op inside fused groups is sped up there (tests/test_whatif_compiled.py); one the
    # graphs do not hold is still an error
    assert whatif(prof, ["aten::mm=2"]).fused_kernels > 0
    with pytest.raises(ExplorerError, match=f"nor an op inside its {graph} compiled-graph"):
        whatif(prof, ["aten::conv=2"])
    assert whatif(prof, ["module=blocks:2"]).events_changed > 0  # a module names them


def test_finding_savings_are_replays():
    """host-sync on the known step: its 2.1 ms wait is not what removing the sync saves; the
    replay says 0.9 ms (the device still runs until 4.1 ms)."""
    from neuron_explorer.analysis import get_rule

    (f,) = get_rule("host-sync").evaluate(known_step())
    assert f.evidence.metrics["sync_ns"] == 2_200_000
    assert f.saving_ns == 900 * US and f.replayed == "these 1 syncs removed"


def test_overlapping_changes_are_marked():
    """Dropping the sync (0.9 ms) and kernels 4x faster (2.1 ms) share time: replayed together
    the step ends when the host does (2.8 ms), 2.2 ms saved, not 3.0 ms."""
    from neuron_explorer.analysis.context import context
    from neuron_explorer.analysis.findings import Finding
    from neuron_explorer.analysis.replay_saving import Replayed, joint_saving, replay_saving
    from neuron_explorer.analysis.runner import mark_overlaps

    profile = known_step()  # held: a context keeps its profile only weakly
    ctx = context(profile)
    with ctx.lock:
        sync = replay_saving(ctx, Replayed("sync", "kind = 'sync'", "drop_syncs"), ("a", "x"))
        fast = replay_saving(ctx, Replayed("4x", "kind = 'kernel'", "scale", 4.0), ("b", "y"))
        assert (sync, fast) == (900 * US, 2100 * US)
        assert joint_saving(ctx, ("a", "x"), ("b", "y")) == 2200 * US
        found = [Finding("a", "low", "x", "", "", sync, 0.2, replayed="sync"),
                 Finding("b", "low", "y", "", "", fast, 0.4, replayed="4x")]  # fmt: skip
        marked = mark_overlaps(ctx, found)
    assert [f.overlaps for f in marked] == [("b",), ("a",)]


def test_bounds_on_collective_waits_say_what_they_overlap():
    """ddp_straggler: rank 1's extra host work makes rank 0 wait at every all-reduce. The
    straggler's bound and the slow all-reduce's are both those waits, and device-idle-gaps'
    replay (the host's time in the gaps removed, rank 1's extra work with it) shortens them:
    each names the others. The waits it cuts are real replayed waits, most of the bound."""
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.analysis.context import context
    from neuron_explorer.analysis.replay_saving import waits_cut

    profile = sample("ddp_straggler")
    found = {f.rule: f for f in run_rules(profile)}
    assert not found["straggler"].replayed and found["device-idle-gaps"].replayed
    assert set(found["straggler"].overlaps) == {"collective-outliers", "device-idle-gaps"}
    assert set(found["collective-outliers"].overlaps) == {"straggler", "device-idle-gaps"}
    assert {"straggler", "collective-outliers"} <= set(found["device-idle-gaps"].overlaps)
    ctx = context(profile)
    with ctx.lock:
        cut = waits_cut(ctx, ("device-idle-gaps", found["device-idle-gaps"].title))
    assert found["straggler"].saving_ns / 2 < cut <= found["device-idle-gaps"].saving_ns
    assert found["host-sync"].overlaps == ()  # a change that leaves the waits alone


@pytest.mark.parametrize("name", SAMPLES)
def test_no_saving_exceeds_its_steps(name):
    """Every finding's saving at most the profiled steps; a replayed change of device work at
    most the device's busy time (the compiled GPT sample included)."""
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.analysis.context import context

    prof = sample(name)
    findings = run_rules(prof)
    ctx = context(prof)
    with ctx.lock:
        total = ctx.total_step_ns
        busy = int(ctx.one("SELECT coalesce(sum(e - s), 0) AS ns FROM busy")["ns"])
    for f in findings:
        assert f.saving_ns <= total, f.rule
        if f.rule in ("memory-bound-op",):
            assert f.saving_ns <= busy, (f.rule, f.saving_ns, busy)


def test_agrees_with_hta_critical_path():
    """HTA 0.5.0's critical path of the same window (tests/data/hta-reference/critical_path.json,
    benchmarks/hta_critical_path.py): the same 34 kernels on the path, found through the
    cudaStreamWaitEvent between cuDNN's FFT stream and the main one; the host's share within
    the annotation's edges HTA leaves out (its path runs from the first op to the last)."""
    from pathlib import Path

    ref = json.loads((Path(__file__).parent / "data" / "hta-reference" / "critical_path.json")
                     .read_text())  # fmt: skip
    prof = real("alexnet")
    page = critical_path(prof, annotation=ref["annotation"], instance=ref["instance"])
    ids = [s.event_id for s in page.segments if s.edge == "own" and s.category != "host"]
    rows = (
        prof.duckdb()
        .execute(
            "SELECT CAST(json_extract(args, '$.correlation') AS BIGINT), dur_ns FROM events "
            f"WHERE id IN ({', '.join(map(str, ids))}) AND kind LIKE 'gpu_%'"
        )
        .fetchall()
    )
    ours = {int(c): int(d) for c, d in rows}
    theirs = {k["correlation"]: k["dur_ns"] for k in ref["kernels"]}
    assert ours == theirs
    assert sum(theirs.values()) == ref["by_bound_ns"]["gpu_compute_bound"]
    edges = page.step_ns - ref["path_ns"]  # before HTA's first op and after its last
    assert 0 <= edges < 0.02 * page.step_ns
    # HTA splits the launch and kernel-to-kernel delays off; we count them as host, device
    overheads = sum(v for k, v in ref["by_bound_ns"].items() if k.endswith("overhead"))
    assert abs(page.by_category["host"] - ref["by_bound_ns"]["cpu_bound"]) <= edges + overheads


def neff_step() -> Profile:
    """One compiled graph launched once (a NEFF of three kernels, the second overlapping the
    first as the NEFF schedules them), an eager kernel queued behind it, and `.item()`."""
    out = _TMP / "neff-step"
    if out.exists():
        return Profile.open(out)
    ev = _Events()
    ev.add(kind="step", name="ProfilerStep#0", start_ns=0, dur_ns=3500 * US, step=0)
    ev.add(kind="runtime", name="launch", op_name="neuron_graph_0_0_forward", start_ns=1 * MS,
           dur_ns=10 * US, step=0, flow_id=1)  # fmt: skip
    for name, start, dur in (("k1", 1100, 1000), ("k2", 1600, 1000), ("k3", 2600, 500)):
        ev.add(layer="device", kind="kernel", name=name, op_name="neuron_graph_0_0_forward",
               start_ns=start * US, dur_ns=dur * US, step=0, flow_id=1, args={"neff": "g0"})  # fmt: skip
    ev.add(kind="runtime", name="launch", op_name="aten::add", start_ns=1200 * US, dur_ns=10 * US,
           step=0, flow_id=2)  # fmt: skip
    ev.add(layer="device", kind="kernel", name="add", op_name="aten::add", start_ns=3100 * US,
           dur_ns=200 * US, step=0, flow_id=2)  # fmt: skip
    ev.add(kind="sync", name=".item()", start_ns=1500 * US, dur_ns=1900 * US, step=0,
           args={"wait_ns": 1800 * US})  # fmt: skip
    with ProfileWriter(out) as w:
        w.write_events(ev.columns())
        w.commit(Manifest(source="capture", origin_unix_ns=time.time_ns(),
                          device_spec=dict(SPEC), steps=(Step(0, 0, 0, 3500 * US),)))  # fmt: skip
    return Profile.open(out)


def test_a_neff_moves_as_one_unit():
    prof = neff_step()
    graph = build_graph(prof)
    kinds = [e.kind for e in graph.edges]
    assert kinds.count("neff") == 2 and kinds.count("queue") == 1  # k1 -> k2, k3; k1 -> add
    # k1 twice as fast: k2 started half-way through it (the NEFF overlaps them) and still
    # ends at 2.6 ms, so nothing after it moves
    assert whatif(prof, ["k1=2"]).saving_ns == 0
    # k2 twice as fast: k3, the eager add, the sync and the host after it all move up 0.5 ms
    assert whatif(prof, ["k2=2"]).saving_ns == 500 * US
    page = critical_path(prof)
    assert page.path_ns == page.step_ns == 3500 * US
    assert [s.label for s in page.segments if s.category == "device compute"] == [
        "neuron_graph_0_0_forward", "neuron_graph_0_0_forward", "neuron_graph_0_0_forward",
        "aten::add",
    ]  # fmt: skip

"""The summary's numbers on the real GPU traces equal sums computed here from the trace JSON."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal

import pytest
from test_analysis_profiles import SHARED, TRACES, neuron_profile, real

from neuron_explorer.analysis import summarize

GPU_TRACES = ("alexnet", "ns_resolution", "nccl", "amd", "compare_base")


def _union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    start = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    return total + (end - start if end is not None else 0)


def _device_work(name: str) -> dict[str, list[dict]]:
    """GPU events of the raw trace by category, with exact integer-ns start and end."""
    with gzip.open(SHARED / TRACES[name], "rt") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    out: dict[str, list[dict]] = {"kernel": [], "gpu_memcpy": [], "gpu_memset": []}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in out:
            s = int(Decimal(e["ts"]) * 1000)
            out[e["cat"]].append({**e, "s": s, "e": s + int(Decimal(e["dur"]) * 1000)})
    return out


@pytest.mark.parametrize("name", GPU_TRACES)
def test_gpu_busy_idle_and_kernel_counts_match_the_trace(name):
    work = _device_work(name)
    (dev,) = summarize(real(name)).devices  # each of these traces has one GPU
    kernels = work["kernel"]
    nccl = [k for k in kernels if "nccl" in k["name"].lower()]
    assert dev.kernels + dev.collectives == len(kernels)
    assert dev.collectives == len(nccl)
    assert dev.transfers == len(work["gpu_memcpy"]) + len(work["gpu_memset"])
    every = [(x["s"], x["e"]) for xs in work.values() for x in xs]
    busy = _union(every)
    window = max(e for _, e in every) - min(s for s, _ in every)
    tolerance = len(every)  # at most 1 ns of rounding per event
    assert abs(dev.busy_ns - busy) <= tolerance
    # HTA's kernel types: communication (nccl*) is not compute
    compute = [(k["s"], k["e"]) for k in kernels if k not in nccl]
    assert abs(dev.compute_ns - _union(compute)) <= tolerance
    assert abs(dev.communication_ns - _union([(k["s"], k["e"]) for k in nccl])) <= len(nccl)
    assert abs(dev.window_ns - window) <= 2
    assert abs(dev.idle_ns - (window - busy)) <= tolerance + 2


@pytest.mark.parametrize("name", GPU_TRACES)
def test_top_kernel_counts_and_times_match_the_trace(name):
    work = _device_work(name)
    top = summarize(real(name)).top_kernels.to_pylist()
    assert top
    for row in top[:5]:
        same = [k for k in work["kernel"] if k["name"] == row["name"]]
        assert row["calls"] == len(same)
        assert abs(row["total_ns"] - sum(k["e"] - k["s"] for k in same)) <= len(same)


@pytest.mark.parametrize("name", GPU_TRACES + ("cpu_only",))
def test_one_breakdown_partitions_the_step_time(name):
    s = summarize(real(name))
    b = s.breakdown
    # THE breakdown: its parts add up to the steps exactly, in total and per step
    assert sum(p.ns for p in b.parts) == b.steps_ns
    for row in s.steps.to_pylist():
        assert sum(row[p.key] or 0 for p in b.parts) == row["dur_ns"]
    assert all(p.ns >= 0 for p in (*b.parts, *b.overlap))
    # the host-side totals still partition the steps on their own
    assert b.compile_ns + b.fallback_ns + b.sync_ns + b.host_other_ns == b.steps_ns
    idle = sum(p.ns for p in b.parts if p.key.startswith("idle_"))
    if s.devices:
        assert b.device_compute_ns + b.communication_ns + b.dma_ns + b.device_idle_ns == b.steps_ns
        assert idle == b.device_idle_ns  # device idle, split by what the host was doing
        assert not any(p.label.startswith("device") for p in b.overlap)
    else:
        assert b.device_idle_ns is None and idle == b.steps_ns
        assert not b.overlap and not any("device" in p.label for p in b.parts)


def test_breakdown_splits_communication_from_compute_and_shows_the_overlap():
    """nccl: all-reduces partly under compute. Exposed communication is a part of the step;
    the part hidden under compute is shown apart, and both come from the trace's kernels."""
    work = _device_work("nccl")
    s = summarize(real("nccl"))
    parts = {p.key: p.ns for p in s.breakdown.parts}
    overlap = {p.key: p.ns for p in s.breakdown.overlap}
    windows = [(w["start_ns"], w["start_ns"] + w["dur_ns"]) for w in s.steps.to_pylist()]
    # trace time of the profile's 0: the first kernel in both
    (first,) = (
        real("nccl")
        .duckdb()
        .execute(
            "SELECT min(start_ns) FROM events WHERE kind IN ('gpu_kernel', 'collective')"
            " AND layer = 'device'"
        )
        .fetchone()
    )
    origin = min(k["s"] for k in work["kernel"]) - first

    def clipped(cat_filter) -> list[tuple[int, int]]:
        out = []
        for k in work["kernel"]:
            if not cat_filter(k):
                continue
            for ws, we in windows:
                a, b = max(k["s"] - origin, ws), min(k["e"] - origin, we)
                if b > a:
                    out.append((a, b))
        return out

    is_nccl = lambda k: k["name"].startswith("nccl")  # noqa: E731 - HTA's test
    comm, comp = _union(clipped(is_nccl)), _union(clipped(lambda k: not is_nccl(k)))
    both = _union(clipped(lambda k: True))
    n = len(work["kernel"])
    assert abs(parts["device_compute_ns"] - comp) <= n
    assert abs(parts["communication_ns"] - (both - comp)) <= n
    assert abs(overlap["comm_overlap_ns"] - (comm - (both - comp))) <= n
    assert parts["communication_ns"] > 0 and overlap["comm_overlap_ns"] > 0


def test_steps_match_the_profiler_steps():
    with gzip.open(SHARED / TRACES["ns_resolution"], "rt") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    steps = sorted(
        (int(e["name"].split("#")[1]), int(Decimal(e["dur"]) * 1000))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )
    s = summarize(real("ns_resolution"))
    assert s.step_stats.count == len(steps)
    got = sorted(zip(s.steps["step"].to_pylist(), s.steps["dur_ns"].to_pylist(), strict=True))
    assert [g[0] for g in got] == [x[0] for x in steps]
    for (_, a), (_, b) in zip(got, steps, strict=True):
        assert abs(a - b) <= 1
    assert s.step_stats.max_ns == max(d for _, d in got)


def test_top_ops_self_time_is_total_minus_children():
    s = summarize(real("alexnet"))
    rows = s.top_ops_total.to_pylist()
    assert rows and all(r["self_ns"] <= r["total_ns"] for r in rows)
    by_self = s.top_ops_self.to_pylist()
    assert [r["self_ns"] for r in by_self] == sorted((r["self_ns"] for r in by_self), reverse=True)


def test_summary_is_json_and_has_no_neuron_block_on_gpu():
    s = summarize(real("nccl"))
    doc = json.loads(json.dumps(s.to_dict()))
    assert doc["readiness"] is None and doc["mfu"] is None
    assert doc["devices"][0]["device"] == "cuda:0"


def test_neuron_summary_engines_mfu_mbu_and_readiness():
    s = summarize(neuron_profile("cpu-fallback"))
    engines = {e.engine: e for e in s.engines}
    assert set(engines) == {"TensorE", "DMA"}  # the DMA queues count as one engine
    # 8 TensorE instructions of 1.1 ms per 10 ms step
    assert engines["TensorE"].utilization == pytest.approx(0.88)
    # 8 matmuls of 2*1024^3 FLOP per 10 ms step against a 90 TFLOP/s peak
    assert s.mfu == pytest.approx(8 * 2 * 1024**3 / 0.010 / 9.0e13, rel=1e-6)
    assert s.mbu == pytest.approx(8 * 6 * 1024**2 / 0.010 / 3.6e11, rel=1e-6)
    r = s.readiness
    (fb,) = r.fallback_ops.to_pylist()
    assert (fb["op"], fb["line"], fb["calls"]) == ("aten::nonzero", 60, 4)
    assert s.breakdown.fallback_ns == 4 * 600_000


def test_neuron_readiness_compile_and_recompiles():
    r = summarize(neuron_profile("compile-dominated")).readiness
    assert r.compile_ns == 50_000_000
    assert (r.first_step_ns, r.steady_step_ns) == (60_000_000, 10_000_000)
    rec = summarize(neuron_profile("recompilation")).readiness.recompiles.to_pylist()
    assert [(x["op"], x["recompiles"]) for x in rec] == [("neuron_graph_0", 3)]
    assert len(rec[0]["shapes"]) == 3
    down = summarize(neuron_profile("float64-downcast")).readiness.downcasts.to_pylist()
    assert down[0]["op"] == "aten::mm" and down[0]["calls"] == 4


def test_a_profile_without_steps_claims_no_start_up_idle():
    """alexnet's trace has no ProfilerStep spans and its first device work comes 30 s in
    (CUDA start-up): device-idle-gaps counts only the gaps while the device is in use."""
    from neuron_explorer.analysis import get_rule

    work = _device_work("alexnet")
    every = sorted((x["s"], x["e"]) for xs in work.values() for x in xs)
    window = max(e for _, e in every) - every[0][0]
    in_use_idle = window - _union(every)
    from neuron_explorer.analysis.context import context

    rule, ctx = get_rule("device-idle-gaps"), context(real("alexnet"))
    with ctx.lock:
        facts = rule.measure(ctx)
    assert facts is not None and facts.gaps_ns <= in_use_idle + len(every)  # never the 30 s
    assert facts.startup_ns > 29e9 and facts.idle_ns < 0.35 * summarize(real("alexnet")).wall_ns
    # and the gaps while the device was in use are cuDNN's start-up too: no finding at all
    assert rule.evaluate(real("alexnet")) == []


def test_a_partial_last_step_is_said():
    """The MI250 trace's last ProfilerStep is a 49 us stub after a 9.3 ms step; the others'
    last steps are whole."""
    assert summarize(real("amd")).step_stats.partial_last_steps == ((0, 2),)
    for name in ("nccl", "ns_resolution", "compare_base"):
        assert summarize(real(name)).step_stats.partial_last_steps == ()


def test_breakdown_splits_host_time_by_cause_without_a_device():
    """A real CPU trace whose steps wait for a slow DataLoader: no device, so the one
    breakdown is the host's time by cause, and data loading is the DataLoader's spans."""
    from test_analysis_profiles import recorded_cpu_problems

    profile = recorded_cpu_problems()
    b = summarize(profile).breakdown
    parts = {p.label: p.ns for p in b.parts}
    assert sum(parts.values()) == b.steps_ns and b.device_compute_ns is None
    loader = (
        profile.duckdb()
        .execute(
            "SELECT sum(dur_ns) FROM events WHERE name LIKE 'enumerate(DataLoader)%' "
            "AND step IS NOT NULL"
        )
        .fetchone()[0]
    )
    assert 0 < parts["data loading"] <= loader
    assert parts["data loading"] >= 0.9 * loader  # the spans barely overlap anything more specific


def test_ranks_side_by_side_and_the_wait_for_the_straggler(capsys):
    """The ddp_straggler sample (rank 1 logs synchronously each step): the summary's per-rank
    table puts the ranks side by side, rank 0's wait at the all-reduces is the time rank 1 spent
    logging, and the breakdown names that idle time as waiting at a collective."""
    from test_analysis_profiles import sample

    from neuron_explorer.analysis import summarize
    from neuron_explorer.cli import main

    s = summarize(sample("ddp_straggler"))
    rows = {r.rank: r for r in s.ranks_table.rows}
    assert sorted(rows) == [0, 1] and rows[0].steps == rows[1].steps == 3
    assert rows[0].wait_ns > 3 * 0.5 * 0.03e9 and rows[1].wait_ns < 0.1 * rows[0].wait_ns
    assert rows[0].compute_ns == rows[1].compute_ns  # the same model on each rank
    parts = {p.key: p.ns for p in s.breakdown.parts}
    assert parts["idle_collective_ns"] >= 0.9 * rows[0].wait_ns
    assert sum(parts.values()) == s.breakdown.steps_ns
    assert summarize(sample("gpt_train")).ranks_table is None  # one rank: no table
    assert main(["summary", str(sample("ddp_straggler").path)]) == 0
    out = capsys.readouterr().out
    assert "Ranks (side by side, never summed)" in out and "steps of all 2 ranks" in out

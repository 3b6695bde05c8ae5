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
    assert abs(dev.compute_ns - _union([(k["s"], k["e"]) for k in kernels])) <= tolerance
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
def test_breakdown_partitions_the_step_time(name):
    s = summarize(real(name))
    b = s.breakdown
    assert b.compile_ns + b.fallback_ns + b.sync_ns + b.host_other_ns == b.steps_ns
    if s.devices:
        assert b.device_compute_ns + b.dma_ns + b.device_idle_ns == b.steps_ns
        for row in s.steps.to_pylist():
            parts = row["device_compute_ns"] + row["dma_ns"] + row["device_idle_ns"]
            assert parts == row["dur_ns"]
    else:
        assert b.device_idle_ns is None


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

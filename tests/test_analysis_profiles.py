"""Small neuron-device profiles written with ProfileWriter, one per known problem, for the
neuron rules while no captured neuron samples exist yet. They follow the events the backend
records (backend/runtime/record.py, backend/compiler.py) and docs/rules.md's conventions; the
capture work will replace them with captured samples.

Also real CPU traces recorded here with torch.profiler (data-loader stall, per-parameter
optimizer, one slow step), and the shared Kineto traces imported once per session.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from neuron_explorer.model.io import ProfileWriter
from neuron_explorer.model.manifest import Manifest, Step
from neuron_explorer.model.profile import Profile

SHARED = Path(__file__).resolve().parent / "data" / "kineto-gpu"
TRACES = {
    "alexnet": "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
    "ns_resolution": "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "nccl": "nccl_parser_config_nccl_data.json.gz",
    "amd": "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "cpu_only": "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "compare_base": "trace_compare_base_base.json.gz",
}
_TMP = Path(tempfile.mkdtemp(prefix="ne-analysis-tests-"))
_CACHE: dict[str, Profile] = {}

SPEC = {
    "name": "trn2-test",
    "peak_flops_bf16": 9.0e13,
    "peak_flops_fp32": 2.25e13,
    "hbm_bytes_per_s": 3.6e11,
    "dma_bytes_per_s": 3.6e11,
    "machine_balance": 250.0,
    "dma_min_efficient_bytes": 4096,
    "tensor_engine_dim": 128,
}
MS = 1_000_000
STEP_NS = 10 * MS
NEURON_PROBLEMS = (
    "cpu-fallback", "recompilation", "compile-dominated", "float64-downcast", "host-sync",
    "small-dma", "memory-bound-op", "tensor-engine-padding", "fp32-matmul", "launch-bound",
    "host-device-copies",
)  # fmt: skip


def real(name: str) -> Profile:
    """A shared Kineto trace imported once per test session."""
    if name not in _CACHE:
        from neuron_explorer.importers import import_traces

        path = SHARED / TRACES[name]
        _CACHE[name] = Profile.open(import_traces([path], _TMP / name))
    return _CACHE[name]


def sample(name: str) -> Profile:
    """A profile captured on the neuron device from samples/NAME.py (samples/profiles)."""
    path = Path(__file__).resolve().parent.parent / "samples" / "profiles" / name
    if not path.exists():
        pytest.skip(f"captured sample {path} not present")
    return Profile.open(path)


def trace_json(name: str) -> list[dict]:
    import gzip

    with gzip.open(SHARED / TRACES[name], "rt") as f:
        return json.load(f)["traceEvents"]


class _Events:
    """Collects event rows as columns."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, **kw) -> int:
        kw.setdefault("rank", 0)
        kw.setdefault("layer", "host")
        kw.setdefault("track", "thread 1" if kw["layer"] == "host" else "kernels")
        kw.setdefault("device", "cpu" if kw["layer"] == "host" else "neuron:0")
        kw["id"] = len(self.rows)
        for k in ("shapes", "dtypes", "args"):
            if k in kw and not isinstance(kw[k], str):
                kw[k] = json.dumps(kw[k])
        self.rows.append(kw)
        return kw["id"]

    def columns(self) -> dict:
        names = {k for r in self.rows for k in r}
        return {k: [r.get(k) for r in self.rows] for k in sorted(names)}


def neuron_profile(problem: str | None, n_steps: int = 4) -> Profile:
    """A neuron profile of `n_steps` healthy steps, plus the one named problem (or none)."""
    key = f"neuron-{problem or 'clean'}"
    if key in _CACHE:
        return _CACHE[key]
    ev = _Events()
    src = {"src_file": "/work/user/train.py", "src_func": "train_step"}
    steps = []
    t = 0
    for i in range(n_steps):
        dur = STEP_NS
        if problem == "compile-dominated" and i == 0:
            dur = 60 * MS
        s0 = t
        ev.add(kind="step", name=f"ProfilerStep#{i}", start_ns=s0, dur_ns=dur, step=i)
        steps.append(Step(step=i, rank=0, start_ns=s0, dur_ns=dur))
        cur = s0 + (dur - STEP_NS)  # a long first step spends its extra time compiling
        if problem == "compile-dominated" and i == 0:
            for j in range(10):
                ev.add(kind="compile", name="compile", op_name="aten::mm", start_ns=s0 + j * 5 * MS,
                       dur_ns=5 * MS, step=i, args={"cache": "miss"}, src_line=10, **src)  # fmt: skip
        # large bf16 matmuls back to back: the device stays busy and compute-bound
        n_mm = {"memory-bound-op": 4, "launch-bound": 0}.get(problem or "", 8)
        dev = cur + 50_000
        for j in range(n_mm):
            ev.add(kind="runtime", name="launch", op_name="aten::mm", start_ns=cur + j * 20_000,
                   dur_ns=10_000, step=i, flow_id=i * 100 + j, src_line=20, **src)  # fmt: skip
            mm_dtype = "float32" if problem == "fp32-matmul" else "bfloat16"
            dim = 130 if problem == "tensor-engine-padding" else 1024
            if problem == "float64-downcast" and j == 0:
                mm_dtype = "float64"
            k = ev.add(layer="device", kind="kernel", name="matmul", op_name="aten::mm",
                       start_ns=dev, dur_ns=1_200_000, step=i, flow_id=i * 100 + j,
                       shapes=[[dim, dim], [dim, dim]], dtypes=[mm_dtype, mm_dtype],
                       flops=2 * 1024**3, bytes_read=4 * 1024**2, bytes_written=2 * 1024**2,
                       src_line=20, **src)  # fmt: skip
            ev.add(layer="device", kind="instruction", name="MatMult", track="TensorE",
                   op_name="aten::mm", start_ns=dev + 50_000, dur_ns=1_100_000, step=i,
                   parent_id=k, flops=2 * 1024**3)  # fmt: skip
            ev.add(layer="device", kind="dma", name="dma", track="DMA q0", op_name="aten::mm",
                   start_ns=dev, dur_ns=50_000, step=i, parent_id=k,
                   bytes_read=4 * 1024**2, bytes_written=4 * 1024**2)  # fmt: skip
            dev += 1_200_000
        if problem == "memory-bound-op":
            for j in range(100):
                ev.add(layer="device", kind="kernel", name="add", op_name="aten::add",
                       start_ns=dev + j * 50_000, dur_ns=50_000, step=i, flops=1 << 20,
                       bytes_read=8 << 20, bytes_written=4 << 20, src_line=30, **src)  # fmt: skip
        if problem == "launch-bound":
            # 200 tiny kernels 45 us apart: each gap is launch latency, the device mostly idle
            for j in range(200):
                ev.add(kind="op", name="aten::mul", start_ns=cur + j * 45_000, dur_ns=30_000,
                       step=i, src_line=50, **src)  # fmt: skip
                ev.add(layer="device", kind="kernel", name="mul", op_name="aten::mul",
                       start_ns=cur + j * 45_000 + 20_000, dur_ns=2_000, step=i, flops=1 << 20,
                       bytes_read=512, bytes_written=512, src_line=50, **src)  # fmt: skip
        if problem == "small-dma":
            for j in range(40):
                ev.add(layer="device", kind="dma", name="dma", track="DMA q1",
                       op_name="aten::index", start_ns=dev + j * 2_000, dur_ns=1_500, step=i,
                       bytes_read=512, bytes_written=512, src_line=40, **src)  # fmt: skip
        if problem == "cpu-fallback":
            ev.add(kind="fallback", name="fallback", op_name="aten::nonzero",
                   start_ns=cur + 9 * MS, dur_ns=600_000, step=i, src_line=60, **src)  # fmt: skip
        if problem == "host-sync":
            ev.add(kind="sync", name=".item()", op_name="aten::_local_scalar_dense",
                   start_ns=cur + 9 * MS, dur_ns=900_000, step=i, src_line=70,
                   args={"bytes": 4, "direction": "d2h", "wait_ns": 900_000}, **src)  # fmt: skip
        if problem == "host-device-copies":
            ev.add(kind="copy", name="copy h2d", op_name="aten::copy_", start_ns=cur + 100_000,
                   dur_ns=300_000, step=i, src_line=80, bytes_written=1 << 20,
                   args={"bytes": 1 << 20, "direction": "h2d", "wait_ns": 0}, **src)  # fmt: skip
        if problem == "recompilation" and i > 0:
            sig = f"(((8, {100 + 7 * i}), torch.float32),)"
            ev.add(kind="compile", name="recompile", op_name=f"neuron_graph_0_{i}",
                   start_ns=cur + 10_000, dur_ns=0, step=i, src_line=90,
                   args={"reason": "new input shapes", "shapes": sig}, **src)  # fmt: skip
            ev.add(kind="compile", name="graph compile", op_name=f"neuron_graph_0_{i}_forward",
                   start_ns=cur + 20_000, dur_ns=150_000, step=i, src_line=90,
                   args={"nodes": 12, "kernels": 3, "graph": "forward"}, **src)  # fmt: skip
        t = s0 + dur
    out = _TMP / key
    if out.exists():
        shutil.rmtree(out)
    with ProfileWriter(out) as w:
        w.write_events(ev.columns())
        w.commit(
            Manifest(
                source="capture",
                origin_unix_ns=time.time_ns(),
                device_spec=dict(SPEC),
                steps=tuple(steps),
            )  # fmt: skip
        )
    _CACHE[key] = Profile.open(out)
    return _CACHE[key]


def test_clean_neuron_profile_has_no_findings():
    from neuron_explorer.analysis import run_rules

    assert run_rules(neuron_profile(None)) == []


@pytest.mark.parametrize("problem", NEURON_PROBLEMS)
def test_each_neuron_problem_is_the_top_finding(problem):
    from neuron_explorer.analysis import run_rules

    found = run_rules(neuron_profile(problem))
    assert found, f"no finding on the {problem} profile"
    # float64 downcasts claim no time saving, so they rank last; everything else ranks first
    ids = [f.rule for f in found]
    assert problem in ids
    if problem != "float64-downcast":
        assert ids[0] == problem, ids


def recorded_cpu_problems() -> Profile:
    """A real torch.profiler CPU trace recorded here: batches from a slow single-process
    DataLoader, a 24-layer MLP updated by SGD(foreach=False), and one step that sleeps."""
    if "recorded" in _CACHE:
        return _CACHE["recorded"]
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from neuron_explorer.importers import import_traces

    class SlowData(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int):
            time.sleep(0.05)  # e.g. decoding an image in the training process
            return torch.randn(32), torch.randn(32)

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(24)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
    loader = torch.utils.data.DataLoader(SlowData(), batch_size=4, num_workers=0)
    trace = _TMP / "recorded.pt.trace.json"
    # a schedule makes torch.profiler record the ProfilerStep#N spans
    plan = schedule(wait=0, warmup=1, active=7, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:  # fmt: skip
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 4:
                with record_function("checkpoint"):
                    time.sleep(1.5)  # a slow step: e.g. a checkpoint written in the loop
            prof.step()
            if i == 7:
                break
    _CACHE["recorded"] = Profile.open(import_traces([trace], _TMP / "recorded"))
    return _CACHE["recorded"]

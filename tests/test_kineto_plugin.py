"""The neuron device in torch.profiler's own output (runtime/kineto_plugin.cpp, a Kineto
PrivateUse1 plugin), through torch's APIs only: a tiny model's training step profiled with
`ProfilerActivity.PrivateUse1`, then key_averages(), export_chrome_trace read back, the same
trace imported by `neuron-explorer import` against trace_handler's profile of that very run,
and a tensorboard_trace_handler trace imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

import neuron_explorer
from neuron_explorer import backend  # noqa: F401 - registers the device
from neuron_explorer.backend.runtime import kineto_plugin
from neuron_explorer.cli import main
from neuron_explorer.model.profile import Profile

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None or os.environ.get("NEURON_KINETO_PLUGIN") == "0",
    reason="no C++ compiler for the plugin, or the plugin turned off",
)
ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
DEVICE_TYPE = torch.autograd.DeviceType.PrivateUse1
KEYS = ("name", "track", "start_ns", "dur_ns", "op_name", "flops", "bytes_read", "src_line")


def _step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("neuron")
    x = torch.randn(8, 16, device="neuron")
    loss = model(x).square().mean()
    loss.backward()
    loss.item()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One profiled step: torch's exported trace (as torch wrote it, plugin activities in it),
    trace_handler's profile of the same cycle, and the profiler for key_averages."""
    tmp = tmp_path_factory.mktemp("kineto")
    handler = neuron_explorer.trace_handler(tmp / "captured")

    def on_trace_ready(prof: profile) -> None:
        raw = handler.collect(prof)
        shutil.copy(raw.trace, tmp / "trace.json")  # before write() takes the plugin's out
        handler.write(raw)

    with profile(activities=ACTIVITIES, on_trace_ready=on_trace_ready) as prof:
        _step()
    trace = json.loads((tmp / "trace.json").read_text())
    return {"tmp": tmp, "prof": prof, "trace": trace, "captured": Profile.open(tmp / "captured")}


def _rows(p: Profile, **where: str) -> list[dict]:
    t = p.table("events").to_pylist()
    return [r for r in t if all(r[k] == v for k, v in where.items())]


def test_the_plugin_is_registered_with_torch():
    assert kineto_plugin.native is not None
    assert kineto_plugin.native.neuron_kineto_registered() == 1


def test_export_chrome_trace_has_the_device_lanes_and_its_kernels(run):
    events = run["trace"]["traceEvents"]
    names = {(e["pid"], e.get("tid"), e["args"]["name"]) for e in events
             if e.get("ph") == "M" and e["name"] in ("process_name", "thread_name")}  # fmt: skip
    assert (0, 0, "neuron") in names and (0, 1, "kernels") in names
    kernels = [e for e in events if e.get("cat") == "kernel"]
    captured = _rows(run["captured"], kind="kernel")
    assert kernels and all((e["pid"], e["tid"]) == (0, 1) for e in kernels)
    assert Counter(e["name"] for e in kernels) == Counter(r["name"] for r in captured)
    # each kernel keeps its modeled duration, and no two overlap on the lane
    assert sorted(e["args"]["modeled dur ns"] for e in kernels) == sorted(
        r["dur_ns"] for r in captured
    )
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in kernels)
    assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:], strict=False))


def test_each_kernel_is_linked_to_its_aten_op_and_flows_from_its_launch(run):
    events = run["trace"]["traceEvents"]
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}  # fmt: skip
    kernels = [e for e in events if e.get("cat") == "kernel"]
    for k in kernels:
        op = ops[k["args"]["External id"]]
        assert op["name"] == k["args"]["op"].split(".")[0]  # aten::addmm for an addmm kernel
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = [e for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"]
    assert len(ends) == len(kernels)
    launches = {(e["pid"], e["tid"], e["ts"]): e for e in events
                if e.get("cat") == "privateuse1_runtime"}  # fmt: skip
    for f in ends:
        s = starts[f["id"]]
        assert launches[(s["pid"], s["tid"], s["ts"])]["name"] == "launch"


def test_key_averages_has_the_device_time_of_each_op(run):
    per_op: dict[str, int] = defaultdict(int)
    for r in _rows(run["captured"], kind="kernel"):
        per_op[r["op_name"].split(".")[0]] += r["dur_ns"]
    averages = {a.key: a for a in run["prof"].key_averages()}
    for op, ns in per_op.items():
        assert averages[op].device_time_total == pytest.approx(ns / 1000, abs=1e-3), op
    table = run["prof"].key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "Self NEURON" in table
    kernels = [a for a in averages.values() if a.device_type == DEVICE_TYPE]  # their own rows
    total_us = sum(a.self_device_time_total for a in kernels)
    assert total_us == pytest.approx(sum(per_op.values()) / 1000, abs=1e-2)


def test_import_of_the_trace_is_the_profile_trace_handler_wrote(run):
    out = run["tmp"] / "imported"
    assert main(["import", str(run["tmp"] / "trace.json"), "-o", str(out), "-q"]) == 0
    imported, captured = Profile.open(out), run["captured"]
    assert imported.manifest.device_spec == captured.manifest.device_spec
    for layer in ("device", "host"):
        a = sorted(tuple(r[k] for k in KEYS) for r in _rows(imported, layer=layer))
        b = sorted(tuple(r[k] for k in KEYS) for r in _rows(captured, layer=layer))
        assert a == b, layer
    assert {r["track"] for r in _rows(imported, layer="device")} >= {"kernels", "TensorE"}


def test_a_tensorboard_trace_handler_trace_imports_with_the_device(tmp_path: Path):
    with profile(activities=ACTIVITIES,
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path / "tb"), use_gzip=True)) as prof:  # fmt: skip
        _step()
    (trace,) = (tmp_path / "tb").glob("*.pt.trace.json.gz")
    out = tmp_path / "imported"
    assert main(["import", str(trace), "-o", str(out), "-q"]) == 0
    kernels = _rows(Profile.open(out), kind="kernel")
    device = [a for a in prof.key_averages() if a.device_type == DEVICE_TYPE]
    assert sum(a.count for a in device) == len(kernels)
    assert sum(r["dur_ns"] for r in kernels) / 1000 == pytest.approx(
        sum(a.self_device_time_total for a in device), abs=1e-2
    )
    launches = {r["flow_id"] for r in _rows(Profile.open(out), kind="runtime", name="launch")}
    assert all(r["flow_id"] in launches for r in kernels)


def test_profile_memory_sees_the_devices_allocations_once(tmp_path: Path):
    # profile_memory=True: the device reports each allocation and free to torch.profiler, as a
    # CUDA allocator does, so key_averages has its memory columns and the trace its samples; the
    # import keeps one counter of it, the runtime's (issue 28)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("neuron")
    x = torch.randn(8, 16, device="neuron")
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        model(x).square().mean().backward()
        held = torch.neuron.memory_allocated()
    assert "NEURON Mem" in prof.key_averages().table(row_limit=3)
    linear = next(a for a in prof.key_averages() if a.key == "aten::linear")
    assert linear.device_memory_usage == (8 * 32 + 8 * 4) * 4  # its outputs, on the device
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    samples = [e["args"] for e in events
               if e.get("name") == "[memory]" and e["args"]["Device Type"] == DEVICE_TYPE.value]  # fmt: skip
    assert samples and max(s["Total Allocated"] for s in samples) >= held
    out = tmp_path / "imported"
    assert main(["import", str(tmp_path / "trace.json"), "-o", str(out), "-q"]) == 0
    counters = Profile.open(out).table("counters").to_pylist()
    device = [c for c in counters if c["track"] == "neuron:0" and c["name"] == "memory_allocated"]
    assert len(device) == len(samples)  # the runtime's records, not the trace's samples again


FALLBACK = """
import json, sys, torch
from torch.profiler import ProfilerActivity, profile
import neuron_explorer
from neuron_explorer.backend.runtime import kineto_plugin
assert kineto_plugin.native is None
model = torch.nn.Linear(16, 4).to("neuron")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
             on_trace_ready=neuron_explorer.trace_handler(sys.argv[1])) as prof:
    model(torch.randn(8, 16, device="neuron")).sum().item()
device = torch.autograd.DeviceType.PrivateUse1
print("device rows", sum(a.device_type == device for a in prof.key_averages()))
"""


def test_without_the_plugin_torch_shows_no_device_and_trace_handler_still_does(tmp_path: Path):
    env = {**os.environ, "NEURON_KINETO_PLUGIN": "0"}
    proc = subprocess.run([sys.executable, "-c", FALLBACK, str(tmp_path / "p")], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "device rows 0" in proc.stdout
    kernels = [r["name"] for r in _rows(Profile.open(tmp_path / "p"), kind="kernel")]
    assert kernels == ["normal", "addmm", "sum"]

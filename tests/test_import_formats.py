"""The Kineto importer on the trace forms that older and other torch.profiler builds write: the
TensorBoard plugin's samples (a top-level JSON array, ProfilerStep#N under cat Operator,
[memory] samples holding only Bytes, tids already reading "stream 7"), an MTIA trace, lanes named
by the trace's thread_name metadata, and a time beyond int64 nanoseconds. Expected values are
read from the traces' JSON here, with the standard json module."""

from __future__ import annotations

import collections
import gzip
import json
from functools import cache
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import DATA, KINETO_GPU, SHARED_KINETO

from neuron_explorer.cli import main
from neuron_explorer.importers import import_traces
from neuron_explorer.model.profile import Profile

TB = DATA / "kineto-tb-plugin"
ARRAY = TB / "resnet50_num_workers_0_array_steps_5_6.pt.trace.json.gz"
MEMORY = TB / "resnet50_num_workers_0_memory_step_5.pt.trace.json.gz"
MTIA = DATA / "kineto-mtia" / "mtia_inference_trace_mtia_inference_rank_0.json.gz"
ALEXNET = KINETO_GPU / SHARED_KINETO["alexnet"]
DEVICE_CATEGORIES = {
    "kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "gpu_user_annotation", "cuda_sync",
    "mtia_ccp_events",
}  # fmt: skip
TRACES = {"array": ARRAY, "memory": MEMORY, "mtia": MTIA, "alexnet": ALEXNET}


@cache
def events_of(name: str) -> list[dict]:
    with gzip.open(TRACES[name], "rb") as f:
        doc = json.loads(f.read())
    return doc if isinstance(doc, list) else doc["traceEvents"]


def is_row(e: dict) -> bool:
    """An events-table row: not metadata, a flow point or a [memory] sample."""
    return e.get("ph") not in ("M", "s", "f", "t") and not (
        e.get("name") == "[memory]" and e.get("ph") != "X"
    )


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Profile]:
    out = tmp_path_factory.mktemp("formats")
    return {name: Profile.open(import_traces([p], out / name)) for name, p in TRACES.items()}


def rows_of(profile: Profile, *columns: str) -> list[dict]:
    return profile.table("events", list(columns) or None).to_pylist()


def test_a_top_level_array_trace_imports_every_event(profiles):
    raw = gzip.open(ARRAY, "rb").read()
    assert raw.lstrip().startswith(b"[")
    expected = collections.Counter(e.get("cat", "") for e in events_of("array") if is_row(e))
    got = profiles["array"].table("events", ["kind"])["kind"].to_pylist()
    assert len(got) == sum(expected.values()) > 20000
    kinds = collections.Counter(got)
    assert kinds["gpu_kernel"] == expected["Kernel"]
    assert kinds["runtime"] == expected["Runtime"]
    assert kinds["op"] + kinds["step"] == expected["Operator"]


def test_an_array_without_its_closing_bracket_imports_the_same(tmp_path, profiles):
    """The Chrome trace format lets a JSON-array trace end without `]` (a profiler killed
    mid-write); the importer reads it as if the bracket were there."""
    text = gzip.open(ARRAY, "rb").read().rstrip()
    assert text.endswith(b"]")
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[:-1].rstrip() + b",\n")
    p = Profile.open(import_traces([cut], tmp_path / "p"))
    assert p.row_count("events") == profiles["array"].row_count("events")


def test_old_profiler_steps_under_operator_are_steps(profiles):
    steps = sorted(
        (int(e["name"].split("#")[1]), int(e["ts"]) * 1000, int(e["dur"]) * 1000)
        for e in events_of("array")
        if e.get("cat") == "Operator" and e["name"].startswith("ProfilerStep#")
    )
    assert [s for s, _, _ in steps] == [5, 6]
    p = profiles["array"]
    origin = p.manifest.origin_unix_ns
    assert [(s.step, s.start_ns + origin, s.dur_ns) for s in p.manifest.steps] == steps
    # ops inside a step carry its number
    ops = p.table("events", ["step"], filter=pc.field("kind") == "op")["step"].to_pylist()
    assert set(ops) <= {5, 6, None} and ops.count(5) > 1000 and ops.count(6) > 1000


def test_tids_that_read_stream_n_name_the_lane_once(profiles):
    expected = {e["tid"] for e in events_of("array") if e.get("cat") == "Kernel"}
    assert expected == {"stream 7"}
    tracks = pc.unique(profiles["array"].table("events", ["track"])["track"]).to_pylist()
    assert {t for t in tracks if "stream" in t} == expected
    assert not [t for t in tracks if "stream stream" in t or "thread thread" in t]


def test_old_memory_samples_with_only_bytes_are_running_sums(profiles):
    """Each [memory] sample of an old trace holds one allocation's change (Bytes); the counter
    is the running sum of the changes per device, from the trace's first sample."""
    samples = [e for e in events_of("memory") if e.get("name") == "[memory]"]
    assert samples and all(set(e["args"]) == {"Device Type", "Device Id", "Bytes"} for e in samples)
    running: dict[str, int] = collections.defaultdict(int)
    expected = []
    for e in sorted(samples, key=lambda e: (e["args"]["Device Type"], e["args"]["Device Id"], e["ts"])):  # fmt: skip
        dev = "cpu" if e["args"]["Device Type"] == 0 else f"cuda:{e['args']['Device Id']}"
        running[dev] += e["args"]["Bytes"]
        expected.append((dev, int(e["ts"]) * 1000, running[dev]))
    p = profiles["memory"]
    got = p.table("counters").to_pylist()
    assert {c["name"] for c in got} == {"memory_allocated"} and {c["unit"] for c in got} == {
        "bytes"
    }
    origin = p.manifest.origin_unix_ns
    assert sorted((c["track"], c["ts_ns"] + origin, int(c["value"])) for c in got) == sorted(
        expected
    )
    assert {d for d, _, _ in expected} == {"cpu", "cuda:0"}


def thread_names(name: str) -> dict[tuple[str, str], str]:
    """(pid, tid) -> the last thread_name metadata's name, as trace viewers show it."""
    return {
        (str(e["pid"]), str(e["tid"])): e["args"]["name"].strip()
        for e in events_of(name)
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }


@pytest.mark.parametrize("name", ["mtia", "alexnet", "array"])
def test_thread_name_metadata_names_the_lanes(profiles, name):
    names = thread_names(name)
    assert names
    expected = collections.Counter()
    for e in events_of(name):
        if not is_row(e):
            continue
        pid, tid = str(e.get("pid", "")), str(e.get("tid", ""))
        default = tid if tid.startswith(("thread", "stream")) else f"thread {tid}"
        if e.get("cat", "").lower() in DEVICE_CATEGORIES:
            default = tid if tid.startswith("stream") else f"stream {tid}"
        expected[names.get((pid, tid), default)] += 1
    got = collections.Counter(profiles[name].table("events", ["track"])["track"].to_pylist())
    assert got == expected


def test_process_name_metadata_names_the_processes(profiles):
    for name in ("mtia", "alexnet"):
        expected = {
            str(e["pid"]): e["args"]["name"].strip()
            for e in events_of(name)
            if e.get("ph") == "M" and e.get("name") == "process_name"
        }
        assert expected
        assert profiles[name].manifest.extra["kineto"][0]["process_names"] == expected


def test_mtia_device_work_and_runtime_calls(profiles):
    evs = events_of("mtia")
    ccp = [e for e in evs if e.get("cat") == "mtia_ccp_events"]
    runtime = [e for e in evs if e.get("cat") == "mtia_runtime"]
    p = profiles["mtia"]
    device = rows_of(p, "layer", "kind", "device", "name", "flow_id")
    dev = [r for r in device if r["layer"] == "device"]
    # HTA's reading: every mtia_ccp_events event is device work, dma* ones memory copies
    assert len(dev) == len(ccp)
    assert collections.Counter(r["kind"] for r in dev) == collections.Counter(
        "gpu_memcpy" if e["name"].startswith("dma") else "gpu_kernel" for e in ccp
    )
    assert {r["device"] for r in dev} == {f"mtia:{e['pid']}" for e in ccp}
    assert sum(r["kind"] == "runtime" for r in device) == len(runtime)
    # launches: device work whose correlation is a runtime call's is linked to it
    launched = {e["args"]["correlation"] for e in runtime if "correlation" in e["args"]}
    linked = sum(e["args"].get("correlation") in launched for e in ccp)
    assert linked > 0 and sum(r["flow_id"] is not None for r in dev) == linked


def test_a_time_beyond_int64_nanoseconds_is_one_line_and_exit_2(tmp_path, capsys):
    """A real op line with its ts moved to 9e15 us (9e18 ns with the base time added overflows
    int64 nanoseconds)."""
    evs = events_of("alexnet")
    ops = [e for e in evs if e.get("cat") == "cpu_op"][:3]
    far = {**ops[2], "ts": 9e15}
    path = tmp_path / "far.json"
    with gzip.open(ALEXNET, "rb") as f:
        top = {k: v for k, v in json.loads(f.read()).items() if k != "traceEvents"}
    path.write_text(json.dumps({**top, "traceEvents": [*ops[:2], far]}, default=float))
    out = tmp_path / "p"
    assert main(["import", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "out of range" in err[0], err
    assert far["name"] in err[0] and not out.exists()


def test_capture_style_import_keeps_thread_id_lanes(tmp_path):
    """thread_names=False (capture's merge nests the runtime's calls on "thread <tid>")."""
    p = Profile.open(import_traces([ALEXNET], tmp_path / "p", thread_names=False))
    tracks = set(pc.unique(p.table("events", ["track"])["track"]).to_pylist())
    tids = {str(e["tid"]) for e in events_of("alexnet") if is_row(e)}
    assert tracks <= {f"thread {t}" for t in tids} | {f"stream {t}" for t in tids}
    assert "thread 2869224" in tracks and "stream 7" in tracks


def test_samples_are_small(profiles):
    for path in (ARRAY, MEMORY, MTIA):
        assert path.stat().st_size < 1 << 20
        assert (path.parent / "README.md").is_file() and (path.parent / "LICENSE").is_file()
    assert Path(TB / "excerpt.py").is_file()


@pytest.mark.parametrize("name", ["array", "mtia"])
def test_host_nesting_is_a_plain_stack_walk_per_lane(profiles, name):
    """parent_id is the innermost earlier host event of the same lane that contains the event,
    as a stack walk finds it (lanes keyed by pid and tid, named by the metadata)."""
    host = [r for r in rows_of(profiles[name], "id", "layer", "track", "start_ns", "dur_ns",
                                "parent_id") if r["layer"] == "host"]  # fmt: skip
    host.sort(key=lambda e: (e["track"], e["start_ns"], -e["dur_ns"], e["id"]))
    stack: list[dict] = []
    track, nested = None, 0
    for e in host:
        if e["track"] != track:
            stack, track = [], e["track"]
        while stack and stack[-1]["start_ns"] + stack[-1]["dur_ns"] <= e["start_ns"]:
            stack.pop()
        need = e["start_ns"] + e["dur_ns"] + (e["dur_ns"] == 0)
        container = next((c for c in reversed(stack) if c["start_ns"] + c["dur_ns"] >= need), None)
        assert e["parent_id"] == (container["id"] if container else None), e
        nested += container is not None
        stack.append(e)
    assert nested > len(host) // 2

"""The Kineto importer on real traces: every count, time and link is checked against the
trace's own JSON, read here independently with the standard json module (exact decimals)."""

from __future__ import annotations

import collections
import gzip
import json
import re
from decimal import Decimal
from functools import cache
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import kineto_trace_paths

from neuron_explorer.model.profile import Profile

TRACES = kineto_trace_paths()
NAMES = sorted(TRACES)

# the importer's documented mapping, restated: Kineto category -> kind
KIND_OF_CAT = {
    "cpu_op": "op", "user_annotation": "annotation", "python_function": "python",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "kernel": "gpu_kernel",
    "gpu_memcpy": "gpu_memcpy", "gpu_memset": "gpu_memset",
    "gpu_user_annotation": "gpu_annotation", "cuda_sync": "sync",
}  # fmt: skip
DEVICE_KINDS = {"gpu_kernel", "gpu_memcpy", "gpu_memset", "gpu_annotation", "sync"}


@cache
def trace_json(name: str) -> dict:
    path = TRACES[name]
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.loads(f.read(), parse_float=Decimal)


def expected_kind(e: dict) -> str | None:
    """The kind the importer must give a trace event, or None when it is not an events row."""
    if e.get("ph") in ("M", "s", "f", "t") or (e.get("name") == "[memory]" and e["ph"] != "X"):
        return None
    cat, name = e.get("cat", ""), e.get("name", "")
    kind = KIND_OF_CAT.get(cat.lower(), "other")
    if kind == "annotation" and re.fullmatch(r"ProfilerStep#\d+", name):
        return "step"
    if kind == "annotation" and name.lower().startswith(("nccl:", "gloo:", "ucc:", "mpi:")):
        return "collective"
    if kind == "gpu_kernel" and "nccl" in name.lower():
        return "collective"
    return kind


def rows(events: list[dict]) -> list[dict]:
    return [e for e in events if expected_kind(e) is not None]


def unix_ns(trace: dict, us: Decimal | int) -> int:
    return int(Decimal(us) * 1000) + int(trace.get("baseTimeNanoseconds", 0))


def events(profile: Profile, *columns: str) -> list[dict]:
    return profile.table("events", columns=list(columns) or None).to_pylist()


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_row_counts_per_kind_match_the_trace(imported_profiles, name):
    profile = Profile.open(imported_profiles[name])
    expected = collections.Counter(expected_kind(e) for e in rows(trace_json(name)["traceEvents"]))
    got = collections.Counter(e["kind"] for e in events(profile, "kind"))
    assert got == expected
    assert profile.manifest.row_counts["events"] == sum(expected.values())


def test_every_time_is_exact_to_the_nanosecond(imported_profiles, name):
    """(name, start, duration) of every row equals the trace's decimal microseconds."""
    trace = trace_json(name)
    profile = Profile.open(imported_profiles[name])
    origin = profile.manifest.origin_unix_ns
    expected = collections.Counter(
        (e["name"], unix_ns(trace, e["ts"]), int(Decimal(e.get("dur", 0)) * 1000))
        for e in rows(trace["traceEvents"])
    )
    got = collections.Counter(
        (e["name"], e["start_ns"] + origin, e["dur_ns"])
        for e in events(profile, "name", "start_ns", "dur_ns")
    )
    assert got == expected
    assert min(e["start_ns"] for e in events(profile, "start_ns")) == 0


def test_ns_resolution_trace_keeps_sub_microsecond_digits(imported_profiles):
    profile = Profile.open(imported_profiles["ns_resolution"])
    starts = pc.add(profile.table("events", ["start_ns"])["start_ns"], 0).to_numpy()
    # the trace's ts carry three decimals: most starts are not whole microseconds
    sub_us = ((starts + profile.manifest.origin_unix_ns) % 1000 != 0).mean()
    assert sub_us > 0.9
    first = trace_json("ns_resolution")["traceEvents"][0]
    assert str(first["ts"]) == "1712195495519689.047"
    row = profile.table(
        "events",
        filter=pc.field("start_ns") == 1712195495519689047 - profile.manifest.origin_unix_ns,
    )
    assert first["name"] in row["name"].to_pylist()


def test_launches_link_runtime_calls_to_device_work(imported_profiles, name):
    """Device work shares flow_id with the runtime call of the same correlation id (the ac2g
    flow), and takes that call's enclosing op as op_name and its step."""
    trace = trace_json(name)["traceEvents"]
    runtime = {
        e["args"]["correlation"]
        for e in trace
        if expected_kind(e) == "runtime" and "correlation" in e.get("args", {})
    }
    device = [
        e
        for e in trace
        if expected_kind(e) in DEVICE_KINDS | {"collective"}
        and e.get("args", {}).get("correlation") in runtime
    ]
    profile = Profile.open(imported_profiles[name])
    con = profile.duckdb()
    linked = con.execute(
        """SELECT d.name, d.dur_ns, r.name, d.op_name, r.op_name, d.step, r.step,
                  json_extract(d.args, '$.correlation'), json_extract(r.args, '$.correlation')
           FROM events d JOIN events r ON d.flow_id = r.flow_id AND r.kind = 'runtime'
           WHERE d.layer = 'device'"""
    ).fetchall()
    assert len(linked) == len(device)
    for _, _, _, d_op, r_op, d_step, r_step, d_corr, r_corr in linked:
        assert d_corr == r_corr and d_op == r_op and d_step == r_step
    # every ac2g flow of the trace whose two ends are events is one of these links
    ac2g = collections.defaultdict(set)
    for e in trace:
        if e.get("cat") == "ac2g":
            ac2g[e["id"]].add(e["ph"])
    both = {i for i, phases in ac2g.items() if {"s", "f"} <= phases}
    corr = {int(c) for *_, c in linked}
    device_corr = {e["args"]["correlation"] for e in device}
    assert {i for i in both if i in device_corr} <= corr


def test_a_known_kernel_has_its_duration_and_launching_op(imported_profiles):
    """AlexNet on an A100: the longest kernel, its duration and the aten op that launched it,
    worked out here from the trace's JSON by containment on the launching thread."""
    trace = trace_json("alexnet")["traceEvents"]
    kernel = max((e for e in trace if e.get("cat") == "kernel"), key=lambda e: e["dur"])
    launch = next(
        e
        for e in trace
        if e.get("cat") == "cuda_runtime"
        and e["args"].get("correlation") == kernel["args"]["correlation"]
    )
    ops = [
        e
        for e in trace
        if e.get("cat") == "cpu_op"
        and e["tid"] == launch["tid"]
        and e["ts"] <= launch["ts"]
        and launch["ts"] + launch["dur"] <= e["ts"] + e["dur"]
    ]
    innermost = max(ops, key=lambda e: (e["ts"], -e["dur"]))
    profile = Profile.open(imported_profiles["alexnet"])
    row = (
        profile.duckdb()
        .execute(
            "SELECT dur_ns, op_name, kind, device, track FROM events WHERE name = ? AND dur_ns = ?",
            [kernel["name"], int(kernel["dur"]) * 1000],
        )
        .fetchall()
    )
    assert row == [
        (int(kernel["dur"]) * 1000, innermost["name"], "gpu_kernel", "cuda:0", "stream 7")
    ]
    assert innermost["name"].startswith("aten::")


def test_steps_are_found(imported_profiles, name):
    trace = trace_json(name)
    expected = sorted(
        (int(e["name"].split("#")[1]), unix_ns(trace, e["ts"]), int(Decimal(e["dur"]) * 1000))
        for e in trace["traceEvents"]
        if expected_kind(e) == "step"
    )
    profile = Profile.open(imported_profiles[name])
    origin = profile.manifest.origin_unix_ns
    got = sorted((s.step, s.start_ns + origin, s.dur_ns) for s in profile.manifest.steps)
    assert got == expected
    # host events starting inside a step carry its number
    con = profile.duckdb()
    for s in profile.manifest.steps:
        outside = con.execute(
            "SELECT count(*) FROM events WHERE layer = 'host' AND step = ? "
            "AND (start_ns < ? OR start_ns >= ?)",
            [s.step, s.start_ns, s.start_ns + s.dur_ns],
        ).fetchone()[0]
        assert outside == 0


def test_ranks_and_devices(imported_profiles, name):
    trace = trace_json(name)
    profile = Profile.open(imported_profiles[name])
    rank = trace.get("distributedInfo", {}).get("rank", 0)
    assert profile.manifest.ranks == (rank,)
    assert set(profile.table("events", ["rank"])["rank"].to_pylist()) == {rank}
    assert [d["name"] for d in profile.manifest.devices] == [
        d["name"] for d in trace.get("deviceProperties", [])
    ]
    assert profile.manifest.source == "kineto"
    assert profile.manifest.inputs == (str(TRACES[name]),)


def test_unknown_categories_are_kept_with_their_category(imported_profiles, name):
    unknown = collections.Counter(
        e.get("cat", "")
        for e in rows(trace_json(name)["traceEvents"])
        if expected_kind(e) == "other"
    )
    profile = Profile.open(imported_profiles[name])
    other = profile.table("events", ["args"], filter=pc.field("kind") == "other")
    got = collections.Counter(json.loads(a)["cat"] for a in other["args"].to_pylist())
    assert got == unknown


def test_host_nesting_matches_a_plain_stack_walk(imported_profiles, name):
    """parent_id (computed with numpy) is the innermost earlier event on the thread that
    contains the event, as a plain stack walk finds it; device events have none."""
    profile = Profile.open(imported_profiles[name])
    host = sorted(
        (e for e in events(profile, "id", "track", "start_ns", "dur_ns", "parent_id", "layer")),
        key=lambda e: (e["track"], e["start_ns"], -e["dur_ns"], e["id"]),
    )
    stack: list[dict] = []
    track = None
    for e in host:
        if e["layer"] != "host":
            assert e["parent_id"] is None
            continue
        if e["track"] != track:
            stack, track = [], e["track"]
        while stack and stack[-1]["start_ns"] + stack[-1]["dur_ns"] <= e["start_ns"]:
            stack.pop()
        end = e["start_ns"] + e["dur_ns"]
        need = end + (e["dur_ns"] == 0)  # an instant is not inside a span ending at it
        container = next((c for c in reversed(stack) if c["start_ns"] + c["dur_ns"] >= need), None)
        assert e["parent_id"] == (container["id"] if container else None)
        stack.append(e)


def test_ops_carry_shapes_and_dtypes(imported_profiles, name):
    ops = [e for e in trace_json(name)["traceEvents"] if expected_kind(e) == "op"]
    with_dims = sum("Input Dims" in e.get("args", {}) for e in ops)
    profile = Profile.open(imported_profiles[name])
    t = profile.table("events", ["shapes", "dtypes"], filter=pc.field("kind") == "op")
    assert t["shapes"].null_count == len(ops) - with_dims
    dims = sorted(json.dumps(e["args"]["Input Dims"]) for e in ops if "Input Dims" in e["args"])
    assert sorted(json.dumps(json.loads(s)) for s in t["shapes"].drop_null().to_pylist()) == dims


def test_args_keep_every_field(imported_profiles):
    profile = Profile.open(imported_profiles["cpu_mlp"])
    trace = trace_json("cpu_mlp")["traceEvents"]
    op = next(e for e in trace if e.get("cat") == "cpu_op")
    row = (
        profile.duckdb()
        .execute("SELECT args FROM events WHERE kind = 'op' ORDER BY start_ns, dur_ns DESC LIMIT 1")
        .fetchone()
    )
    assert json.loads(row[0], parse_float=Decimal) == op["args"]


def test_sample_trace_is_small_and_committed():
    sample = Path(TRACES["cpu_mlp"])
    assert sample.stat().st_size < 1 << 20


def test_source_lines_where_python_events_exist(imported_profiles, name):
    n_python = sum(e.get("cat") == "python_function" for e in trace_json(name)["traceEvents"])
    profile = Profile.open(imported_profiles[name])
    ops = profile.table("events", ["src_file", "src_line"], filter=pc.field("kind") == "op")
    if n_python == 0:
        assert ops["src_file"].null_count == len(ops)
        assert profile.row_count("stacks") == 0
    else:
        assert ops["src_file"].null_count < len(ops)
        assert ops["src_line"].null_count == ops["src_file"].null_count
        assert profile.row_count("stacks") > 0


def test_memory_samples_become_counters(imported_profiles, name):
    mem = [
        e
        for e in trace_json(name)["traceEvents"]
        if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {})
    ]
    profile = Profile.open(imported_profiles[name])
    got = profile.table("counters", filter=pc.field("name") == "memory_allocated")
    assert got.num_rows == len(mem)
    assert sorted(got["value"].to_pylist()) == sorted(
        float(e["args"]["Total Allocated"]) for e in mem
    )


def test_older_category_names_map_like_current_ones(tmp_path):
    """Traces from older PyTorch name categories Operator, Runtime, Kernel, Memcpy, Memset."""
    from neuron_explorer.importers import import_traces

    def ev(cat: str, name: str, pid: int, tid: int, ts: int, dur: int, **args: object) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}  # fmt: skip

    trace = {
        "traceEvents": [
            ev("Operator", "aten::mm", 1, 1, 100, 50),
            ev("Runtime", "cudaLaunchKernel", 1, 1, 110, 5, correlation=7),
            ev("Kernel", "gemm", 0, 7, 130, 20, correlation=7, device=0),
            ev("Memcpy", "Memcpy HtoD", 0, 7, 160, 4, correlation=8, bytes=64),
            ev("Memset", "Memset (Device)", 0, 7, 170, 1, correlation=9, bytes=16),
            ev("cuda_driver", "cuLaunchKernel", 1, 1, 120, 3),
        ]
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(trace))
    p = Profile.open(import_traces([path], tmp_path / "p"))
    rows = {e["name"]: e for e in events(p)}
    assert {n: (r["kind"], r["layer"]) for n, r in rows.items()} == {
        "aten::mm": ("op", "host"),
        "cudaLaunchKernel": ("runtime", "host"),
        "cuLaunchKernel": ("runtime", "host"),
        "gemm": ("gpu_kernel", "device"),
        "Memcpy HtoD": ("gpu_memcpy", "device"),
        "Memset (Device)": ("gpu_memset", "device"),
    }
    kernel, launch = rows["gemm"], rows["cudaLaunchKernel"]
    assert kernel["flow_id"] == launch["flow_id"] == launch["id"]
    assert kernel["op_name"] == launch["op_name"] == "aten::mm"
    assert launch["parent_id"] == rows["aten::mm"]["id"]
    assert (kernel["track"], kernel["device"]) == ("stream 7", "cuda:0")
    assert (rows["Memcpy HtoD"]["bytes_read"], rows["Memcpy HtoD"]["bytes_written"]) == (64, 64)
    assert (rows["Memset (Device)"]["bytes_read"], rows["Memset (Device)"]["bytes_written"]) == (
        None,
        16,
    )


def test_fwdbwd_flows_link_forward_and_backward_ops(imported_profiles, name):
    """Every complete fwdbwd flow of the trace joins two ops (or, where the flow_id was taken,
    is kept in the args); the backward end is an autograd op."""
    phases = collections.defaultdict(set)
    for e in trace_json(name)["traceEvents"]:
        if e.get("cat") == "fwdbwd":
            phases[e["id"]].add(e["ph"])
    pairs = sum(p >= {"s", "f"} for p in phases.values())
    con = Profile.open(imported_profiles[name]).duckdb()
    linked = con.execute(
        "SELECT b.name FROM events f JOIN events b ON b.flow_id = f.id AND b.id <> f.id "
        "WHERE f.flow_id = f.id AND f.kind = 'op' AND b.kind = 'op'"
    ).fetchall()
    in_args = con.execute(
        "SELECT count(*) FROM events WHERE json_extract(args, '$.fwdbwd_flow') IS NOT NULL"
    ).fetchone()[0]
    # in these traces no op is at both ends of two flows, so none lands in the args
    assert (len(linked), in_args) == (pairs, 0)
    assert all("Backward" in n or "backward" in n.lower() for (n,) in linked)

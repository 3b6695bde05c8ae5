"""Exports on real profiles: the shared Kineto traces (imported once per session by
conftest's `imported_profiles`) and a neuron capture of samples/gpt_train.py, exported to
Perfetto JSON and CSV and read back with json.load and pyarrow to check that nothing was lost or
invented."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow.csv as pacsv
import pytest
from conftest import KINETO_GPU, SHARED_KINETO, kineto_trace_paths

from neuron_explorer.cli import main
from neuron_explorer.exporters import EXPORTERS, export
from neuron_explorer.model import TABLES, Profile

ROOT = Path(__file__).resolve().parent.parent
NEURON_TRACKS = ["kernels", "TensorE", "VectorE", "ScalarE", "GpSimdE"]


@pytest.fixture(scope="module")
def profiles(imported_profiles) -> dict[str, Profile]:
    return {name: Profile.open(path) for name, path in imported_profiles.items()}


@pytest.fixture(scope="module")
def neuron_profile(tmp_path_factory) -> Profile:
    """samples/gpt_train.py captured on the neuron device: kernels, engines, DMA, memory."""
    pytest.importorskip("torch")
    from neuron_explorer.capture.runner import Schedule, run_captured

    out = tmp_path_factory.mktemp("neuron") / "gpt"
    script = ROOT / "samples" / "gpt_train.py"
    result = run_captured(["python", str(script), "--steps", "4"], out, Schedule(1, 1, 2))
    assert result.exit_code == 0
    return Profile.open(out)


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f, parse_float=Decimal)  # Decimal: check precision without float error


def _expected_links(con) -> int:
    """Flow members but the first of each (rank, flow_id), less those whose parent is in the
    same flow (a kernel's instructions: the arrow goes to the kernel)."""
    (members,) = con.execute(
        "SELECT count(*) FROM events e WHERE flow_id IS NOT NULL AND NOT EXISTS (SELECT 1 "
        "FROM events p WHERE p.id = e.parent_id AND p.flow_id = e.flow_id AND p.rank = e.rank)"
    ).fetchone()
    (flows,) = con.execute(
        "SELECT count(*) FROM (SELECT DISTINCT rank, flow_id FROM events WHERE flow_id IS NOT NULL)"
    ).fetchone()
    return members - flows


def _by_phase(trace: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in trace["traceEvents"]:
        out.setdefault(e["ph"], []).append(e)
    return out


@pytest.mark.parametrize("name", sorted(kineto_trace_paths()))
def test_perfetto_round_trip(profiles, tmp_path, name):
    _check_round_trip(profiles[name], tmp_path)


def test_perfetto_round_trip_neuron_capture(neuron_profile, tmp_path):
    _check_round_trip(neuron_profile, tmp_path)


def _check_round_trip(prof: Profile, tmp_path: Path) -> None:
    result = export(prof, "perfetto", tmp_path / "t.json")
    trace = _load(result.path)
    ph = _by_phase(trace)
    con = prof.duckdb()

    # every event once, under its kind
    spans = ph.get("X", []) + ph.get("i", [])
    want = dict(con.execute("SELECT kind, count(*) FROM events GROUP BY kind").fetchall())
    assert Counter(e["cat"] for e in spans) == want
    assert sorted(e["args"]["id"] for e in spans) == sorted(
        r[0] for r in con.execute("SELECT id FROM events").fetchall()
    )
    n_instants = con.execute("SELECT count(*) FROM events WHERE dur_ns = 0").fetchone()[0]
    assert len(ph.get("i", [])) == n_instants
    assert result.counts.get("spans", 0) == len(ph.get("X", []))

    # flows: an s and an f per linked event, same id, one per (rank, flow_id) member but the first
    starts = {e["id"]: e for e in ph.get("s", [])}
    finishes = {e["id"]: e for e in ph.get("f", [])}
    assert len(starts) == len(ph.get("s", [])) and starts.keys() == finishes.keys()
    assert all(e["bp"] == "e" for e in finishes.values())
    assert len(starts) == _expected_links(con)

    # names for every process and thread that holds an event
    procs = {e["pid"]: e["args"]["name"] for e in ph["M"] if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ph["M"] if e["name"] == "thread_name"}  # fmt: skip
    for e in spans + list(starts.values()) + list(finishes.values()):
        assert e["pid"] in procs and (e["pid"], e["tid"]) in threads
    tracks = {r[0] for r in con.execute("SELECT DISTINCT track FROM events").fetchall()}
    assert set(threads.values()) == tracks

    # counters: every finite sample
    (finite,) = con.execute("SELECT count(*) FROM counters WHERE isfinite(value)").fetchone()
    assert len(ph.get("C", [])) == finite
    assert trace["otherData"]["origin_unix_ns"] == prof.manifest.origin_unix_ns


def test_kernel_times_keep_nanoseconds(profiles, tmp_path):
    """Against the raw trace: every kernel's exported dur equals its recorded dur to the
    nanosecond, and its ts differs from the recorded ts by one constant (the origin)."""
    with gzip.open(KINETO_GPU / SHARED_KINETO["ns_resolution"], "rt") as f:
        raw = json.load(f, parse_float=Decimal)
    raw_kernels = {
        e["args"]["correlation"]: e for e in raw["traceEvents"] if e.get("cat") == "kernel"
    }
    trace = _load(export(profiles["ns_resolution"], "perfetto", tmp_path / "t.json").path)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "gpu_kernel"]
    assert len(kernels) == len(raw_kernels) > 1000
    offsets = set()
    fractional = 0
    for e in kernels:
        r = raw_kernels[e["args"]["args"]["correlation"]]
        assert e["name"] == r["name"]
        assert Decimal(e["dur"]) == Decimal(r["dur"])
        offsets.add(Decimal(r["ts"]) - Decimal(e["ts"]))
        fractional += Decimal(e["ts"]) % 1 != 0
    assert len(offsets) == 1
    origin_us = Decimal(profiles["ns_resolution"].manifest.origin_unix_ns) / 1000
    assert offsets == {origin_us}
    assert fractional > 1000  # the nanoseconds are really there, not rounded to microseconds


def test_launch_flows_link_host_runtime_to_device_kernel(profiles, tmp_path):
    trace = _load(export(profiles["alexnet"], "perfetto", tmp_path / "t.json").path)
    ph = _by_phase(trace)
    procs = {e["pid"]: e["args"]["name"] for e in ph["M"] if e["name"] == "process_name"}
    by_id = {e["args"]["id"]: e for e in ph["X"] + ph.get("i", [])}
    starts = {e["id"]: e for e in ph["s"]}
    launches = 0
    for f in ph["f"]:
        kernel, s = by_id[f["id"]], starts[f["id"]]
        assert (f["pid"], f["tid"], f["ts"]) == (kernel["pid"], kernel["tid"], kernel["ts"])
        if kernel["cat"] == "gpu_kernel":
            assert "device cuda:0" in procs[f["pid"]] and "host" in procs[s["pid"]]
            launches += 1
    assert launches == sum(e["cat"] == "gpu_kernel" for e in ph["X"])


def test_gzip_output_beside_the_profile(profiles):
    prof = profiles["alexnet"]
    out = prof.path.parent / f"{prof.path.name}.perfetto.json.gz"
    try:
        result = export(prof, "perfetto")
        assert result.path == out
        with open(out, "rb") as f:
            assert f.read(2) == b"\x1f\x8b"
        c = result.counts
        written = c["spans"] + c["instants"] + 2 * c["flows"] + c["metadata"]  # s + f per flow
        assert len(_load(out)["traceEvents"]) == written
    finally:
        out.unlink(missing_ok=True)


@pytest.mark.parametrize("name", ["ns_resolution", "alexnet"])
def test_csv_round_trip(profiles, tmp_path, name):
    prof = profiles[name]
    result = export(prof, "csv", tmp_path / "tables")
    assert json.loads((result.path / "manifest.json").read_text()) == json.loads(
        (prof.path / "manifest.json").read_text()
    )
    for name, table in TABLES.items():
        got = pacsv.read_csv(
            result.path / f"{name}.csv",
            parse_options=pacsv.ParseOptions(newlines_in_values=True),  # quoted multi-line args
        )
        assert got.num_rows == prof.row_count(name) == result.counts[f"{name}.csv"]
        assert got.column_names == [c.name for c in table.columns]
        if name == "events":
            want = prof.table("events", columns=["id", "dur_ns", "name"]).sort_by("id")
            got = got.select(["id", "dur_ns", "name"]).sort_by("id")
            assert got.column("dur_ns").to_pylist() == want.column("dur_ns").to_pylist()
            assert got.column("name").to_pylist() == want.column("name").to_pylist()


def test_every_exporter_writes_atomically_and_refuses_to_overwrite(profiles, tmp_path):
    prof = profiles["alexnet"]
    for name in EXPORTERS:
        out = tmp_path / ("t.json" if name == "perfetto" else "t-csv")
        export(prof, name, out)
        with pytest.raises(Exception, match="output exists; use --force"):
            export(prof, name, out)
        export(prof, name, out, force=True)
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_export_and_its_errors(profiles, tmp_path, capsys):
    src = profiles["alexnet"].path
    out = tmp_path / "a.json"
    assert main(["export", str(src), "-o", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert main(["export", str(src), "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"neuron-explorer: error: {out}: output exists; use --force to replace it\n"  # fmt: skip
    assert main(["export", str(src), "-o", str(out), "--force"]) == 0
    assert main(["export", str(src), "-o", str(tmp_path / "a.txt")]) == 2
    assert "named .json or .json.gz" in capsys.readouterr().err
    assert main(["export", str(src), "--format", "csv", "-o", str(src / "inside")]) == 2
    assert "overlaps the profile" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["export", str(src), "-o", str(blocker / "t.json")]) == 2
    assert capsys.readouterr().err == f"neuron-explorer: error: {blocker / 't.json'}: cannot write there, {blocker} is not a directory\n"  # fmt: skip


def test_corrupt_profile_gives_one_line_and_no_output(profiles, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(profiles["alexnet"].path, broken)
    data = (broken / "events.parquet").read_bytes()
    (broken / "events.parquet").write_bytes(data[: len(data) // 2])
    for fmt, out in (("perfetto", tmp_path / "b.json"), ("csv", tmp_path / "b-csv")):
        assert main(["export", str(broken), "--format", fmt, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "events.parquet: corrupt Parquet table" in err[0], err
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_neuron_lanes_flows_and_memory(neuron_profile, tmp_path):
    """The modeled device reads as on the chip: one process, kernels then engines then DMA
    queues in order, one arrow per kernel launch (none to its instructions), memory counter."""
    trace = _load(export(neuron_profile, "perfetto", tmp_path / "n.json").path)
    ph = _by_phase(trace)
    (pid,) = [e["pid"] for e in ph["M"] if e["name"] == "process_name"
              and e["args"]["name"] == "rank 0 device neuron:0"]  # fmt: skip
    names = {e["tid"]: e["args"]["name"] for e in ph["M"]
             if e["name"] == "thread_name" and e["pid"] == pid}  # fmt: skip
    order = {e["tid"]: e["args"]["sort_index"] for e in ph["M"]
             if e["name"] == "thread_sort_index" and e["pid"] == pid}  # fmt: skip
    lanes = [names[t] for t in sorted(names, key=order.get)]
    engines = [lane for lane in lanes if not lane.startswith("DMA q")]
    queues = [int(lane.removeprefix("DMA q")) for lane in lanes if lane.startswith("DMA q")]
    assert engines == [t for t in NEURON_TRACKS if t in engines] and engines[0] == "kernels"
    assert queues == sorted(queues) and len(queues) > 1
    assert lanes[: len(engines)] == engines  # DMA queues after the engines

    by_id = {e["args"]["id"]: e for e in ph["X"] + ph.get("i", [])}
    starts = {e["id"]: e for e in ph["s"]}
    targets = Counter(by_id[f["id"]]["cat"] for f in ph["f"])
    assert targets["kernel"] == sum(e["cat"] == "kernel" for e in ph["X"]) > 0
    assert targets["instruction"] == targets["dma"] == 0
    for f in ph["f"]:
        if by_id[f["id"]]["cat"] == "kernel":
            s = starts[f["id"]]
            source = next(e for e in ph["X"] if (e["pid"], e["tid"], e["ts"]) == (s["pid"], s["tid"], s["ts"]) and e["cat"] == "runtime")  # fmt: skip
            assert source["args"]["flow_id"] == by_id[f["id"]]["args"]["flow_id"]
            break

    memory = [e for e in ph["C"] if e["name"] == "memory_allocated"]
    assert memory and all(e["pid"] == pid and "bytes" in e["args"] for e in memory)
    assert len(ph["C"]) == neuron_profile.row_count("counters")


def test_two_ranks_export_as_separate_processes(profiles, tmp_path):
    """The alexnet profile written again as ranks 0 and 1 (events/rank=N/ files): each rank gets
    its own processes, and flows never cross ranks even though flow ids repeat."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from neuron_explorer.model import ProfileWriter

    src = profiles["alexnet"]
    one = src.table("events")
    shift = pc.max(one["id"]).as_py() + 1
    other = one.set_column(one.schema.get_field_index("rank"), "rank",
                           pa.array([1] * one.num_rows, pa.int32()))  # fmt: skip
    for col in ("id", "parent_id"):
        i = other.schema.get_field_index(col)
        other = other.set_column(i, col, pc.add(other[col], shift))
    with ProfileWriter(tmp_path / "two") as w:
        w.write_events(pa.concat_tables([one, other.cast(one.schema)]))
        w.commit(dataclasses.replace(src.manifest, ranks=(0, 1)))
    two = Profile.open(tmp_path / "two")
    assert (two.path / "events" / "rank=1").is_dir()

    trace = _load(export(two, "perfetto", tmp_path / "t.json").path)
    ph = _by_phase(trace)
    procs = {e["pid"]: e["args"]["name"] for e in ph["M"] if e["name"] == "process_name"}
    by_id = {e["args"]["id"]: e for e in ph["X"] + ph.get("i", [])}
    for e in by_id.values():
        assert procs[e["pid"]].startswith(f"rank {0 if e['args']['id'] < shift else 1} ")
    assert len(by_id) == 2 * one.num_rows
    starts = {e["id"]: e for e in ph["s"]}
    assert len(ph["f"]) == 2 * len(_by_phase(_load(export(src, "perfetto", tmp_path / "o.json").path))["f"])  # fmt: skip
    for f in ph["f"]:
        assert procs[f["pid"]].split()[1] == procs[starts[f["id"]]["pid"]].split()[1]

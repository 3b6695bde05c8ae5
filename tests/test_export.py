"""Exports on real traces: the shared Kineto traces are imported, exported to Perfetto JSON and
CSV, and read back with json.load and pyarrow to check that nothing was lost or invented."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pyarrow.csv as pacsv
import pytest

from explorer.cli import main
from explorer.exporters import EXPORTERS, export
from explorer.importers import import_traces
from explorer.model import TABLES, Profile

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "kineto-gpu"
NS_TRACE = "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
A100_TRACE = "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz"
ALL_TRACES = sorted(p.name for p in TRACES.glob("*.json.gz"))


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict[str, Profile]:
    """Every shared trace imported once for this module."""
    if not ALL_TRACES:
        pytest.fail(f"no shared traces in {TRACES}")
    root = tmp_path_factory.mktemp("imported")
    out = {}
    for name in ALL_TRACES:
        out[name] = Profile.open(import_traces([TRACES / name], root / name.split(".")[0]))
    return out


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f, parse_float=Decimal)  # Decimal: check precision without float error


def _by_phase(trace: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for e in trace["traceEvents"]:
        out.setdefault(e["ph"], []).append(e)
    return out


@pytest.mark.parametrize("trace_name", ALL_TRACES)
def test_perfetto_round_trip(profiles, tmp_path, trace_name):
    prof = profiles[trace_name]
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
    (links,) = con.execute(
        "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM events "
        "WHERE flow_id IS NOT NULL GROUP BY rank, flow_id)"
    ).fetchone()
    assert len(starts) == links

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
    with gzip.open(TRACES / NS_TRACE, "rt") as f:
        raw = json.load(f, parse_float=Decimal)
    raw_kernels = {
        e["args"]["correlation"]: e for e in raw["traceEvents"] if e.get("cat") == "kernel"
    }
    trace = _load(export(profiles[NS_TRACE], "perfetto", tmp_path / "t.json").path)
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
    origin_us = Decimal(profiles[NS_TRACE].manifest.origin_unix_ns) / 1000
    assert offsets == {origin_us}
    assert fractional > 1000  # the nanoseconds are really there, not rounded to microseconds


def test_launch_flows_link_host_runtime_to_device_kernel(profiles, tmp_path):
    trace = _load(export(profiles[A100_TRACE], "perfetto", tmp_path / "t.json").path)
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
    prof = profiles[A100_TRACE]
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


@pytest.mark.parametrize("trace_name", [NS_TRACE, A100_TRACE])
def test_csv_round_trip(profiles, tmp_path, trace_name):
    prof = profiles[trace_name]
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
    prof = profiles[A100_TRACE]
    for name in EXPORTERS:
        out = tmp_path / ("t.json" if name == "perfetto" else "t-csv")
        export(prof, name, out)
        with pytest.raises(Exception, match="output exists; use --force"):
            export(prof, name, out)
        export(prof, name, out, force=True)
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_cli_export_and_its_errors(profiles, tmp_path, capsys):
    src = profiles[A100_TRACE].path
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


def test_corrupt_profile_gives_one_line_and_no_output(profiles, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(profiles[A100_TRACE].path, broken)
    data = (broken / "events.parquet").read_bytes()
    (broken / "events.parquet").write_bytes(data[: len(data) // 2])
    for fmt, out in (("perfetto", tmp_path / "b.json"), ("csv", tmp_path / "b-csv")):
        assert main(["export", str(broken), "--format", fmt, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "events.parquet: corrupt Parquet table" in err[0], err
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]

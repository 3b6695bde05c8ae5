"""The importer on traces this test records with torch.profiler on CPU (a small model with
record_shapes, with_stack and profile_memory): source lines, stacks, sources/, memory counters,
forward/backward links, ranks from several files."""

from __future__ import annotations

import gzip
import inspect
import json
from pathlib import Path

import pyarrow.compute as pc
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from neuron_explorer.importers import import_traces
from neuron_explorer.model.profile import Profile

HERE = Path(__file__).resolve().parent
ACTIVE = 3


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def train_step(model: TinyNet, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def record(path: Path, *, with_stack: bool = True) -> Path:
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        with_stack=with_stack,
        profile_memory=True,
        schedule=schedule(wait=1, warmup=1, active=ACTIVE),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(2 + ACTIVE):
            train_step(model, opt, x)
            prof.step()
    return path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """(trace, profile, trace JSON) for one recorded run, imported with the tests as a root."""
    d = tmp_path_factory.mktemp("recorded")
    trace = record(d / "tiny.pt.trace.json")
    prof = import_traces([trace], d / "profile", source_roots=[HERE])
    return trace, prof, json.loads(trace.read_text())


def test_source_lines_point_at_the_user_code(recorded):
    _, prof, _ = recorded
    p = Profile.open(prof)
    addmm = p.table(
        "events", ["src_file", "src_line", "src_func"], filter=pc.field("name") == "aten::addmm"
    ).to_pylist()
    assert len(addmm) == 2 * ACTIVE  # two Linear layers per step
    # torch.profiler's python events give a function's def line (docs/architecture.md)
    forward_line = inspect.getsourcelines(TinyNet.forward)[1]
    for row in addmm:
        assert Path(row["src_file"]).name == Path(__file__).name
        assert (row["src_func"], row["src_line"]) == ("forward", forward_line)


def test_every_op_under_python_frames_has_a_stack(recorded):
    _, prof, trace = recorded
    p = Profile.open(prof)
    ops = p.table("events", ["stack_id", "src_file"], filter=pc.field("kind") == "op")
    assert ops["stack_id"].null_count == 0
    assert ops["src_file"].null_count < len(ops)
    stacks = p.table("stacks")
    n_py = sum(e.get("cat") == "python_function" for e in trace["traceEvents"])
    assert n_py > 0 and stacks.num_rows > 0
    # every stack runs from depth 0 without holes, and the referenced ids exist
    con = p.duckdb()
    holes = con.execute(
        "SELECT count(*) FROM (SELECT stack_id, max(depth) + 1 = count(*) AS ok "
        "FROM stacks GROUP BY stack_id) WHERE NOT ok"
    ).fetchone()[0]
    assert holes == 0
    missing = con.execute(
        "SELECT count(*) FROM events e WHERE stack_id IS NOT NULL "
        "AND stack_id NOT IN (SELECT stack_id FROM stacks)"
    ).fetchone()[0]
    assert missing == 0
    # the innermost frame of an op's stack is the python function it ran under
    frame = con.execute(
        "SELECT s.function FROM events e JOIN stacks s USING (stack_id) "
        "WHERE e.name = 'aten::addmm' AND s.depth = 0 LIMIT 1"
    ).fetchone()[0]
    assert frame.startswith("<built-in") or frame == "forward" or "linear" in frame


def test_sources_are_kept_in_the_profile(recorded):
    _, prof, _ = recorded
    p = Profile.open(prof)
    files = set(p.table("events", ["src_file"])["src_file"].drop_null().to_pylist())
    mine = next(f for f in files if Path(f).name == Path(__file__).name)
    assert p.source_text(mine) == Path(__file__).read_text()


def test_memory_events_become_counters(recorded):
    _, prof, trace = recorded
    mem = [e for e in trace["traceEvents"] if e.get("name") == "[memory]"]
    assert mem, "profile_memory=True records [memory] events"
    p = Profile.open(prof)
    c = p.table("counters", filter=pc.field("name") == "memory_allocated").to_pylist()
    assert len(c) == len(mem)
    assert {r["track"] for r in c} == {"cpu"} and {r["unit"] for r in c} == {"bytes"}
    assert sorted(r["value"] for r in c) == sorted(e["args"]["Total Allocated"] for e in mem)
    origin = p.manifest.origin_unix_ns
    base = trace["baseTimeNanoseconds"]
    assert sorted(r["ts_ns"] + origin for r in c) == sorted(
        round(e["ts"] * 1000) + base for e in mem
    )


def test_backward_ops_are_linked_to_their_forward_op(recorded):
    _, prof, trace = recorded
    pairs = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "fwdbwd":
            pairs.setdefault(e["id"], set()).add(e["ph"])
    n_pairs = sum(v == {"s", "f"} for v in pairs.values())
    con = Profile.open(prof).duckdb()
    linked = con.execute(
        "SELECT f.name, b.name FROM events f JOIN events b ON f.flow_id = b.flow_id "
        "AND f.id = f.flow_id AND b.id <> f.id WHERE f.kind = 'op' AND b.kind = 'op'"
    ).fetchall()
    assert n_pairs > 0 and len(linked) == n_pairs
    assert all("Backward" in bwd for _, bwd in linked)
    assert ("aten::addmm", "AddmmBackward0") in linked


def test_several_files_are_several_ranks(tmp_path, recorded):
    trace, _, _ = recorded
    (tmp_path / "b").mkdir()
    second = record(tmp_path / "b" / "rank1.pt.trace.json", with_stack=False)
    gz = tmp_path / "b" / "rank1.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(second.read_bytes()))
    second.unlink()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "rank0.pt.trace.json").write_bytes(trace.read_bytes())
    # two recordings, one after the other: two runs to the one-run check, merged on purpose
    out = import_traces([tmp_path / "a", gz], tmp_path / "two", mixed_runs=True)
    p = Profile.open(out)
    assert p.manifest.ranks == (0, 1)
    assert (out / "events" / "rank=0").is_dir() and (out / "events" / "rank=1").is_dir()
    per_rank = p.duckdb().execute("SELECT rank, count(*) FROM events GROUP BY 1 ORDER BY 1")
    counts = dict(per_rank.fetchall())
    assert counts[0] == Profile.open(recorded[1]).row_count("events") and counts[1] > 0
    assert {s.rank for s in p.manifest.steps} == {0, 1}
    ids = p.table("events", ["id"])["id"]
    assert pc.count_distinct(ids).as_py() == len(ids)

"""Read-only SQL: limits, time limit, refusal of writes and file access, and every query in
docs/agents.md runs on a real profile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_analysis_profiles import neuron_profile, real, sample

from neuron_explorer.analysis import run_query
from neuron_explorer.errors import ExplorerError

AGENTS_MD = Path(__file__).resolve().parent.parent / "docs" / "agents.md"


def _doc_queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", AGENTS_MD.read_text(encoding="utf-8"), re.S)


def test_agents_md_has_ten_queries():
    assert len(_doc_queries()) >= 10


@pytest.mark.parametrize("i", range(len(_doc_queries())))
def test_every_agents_md_query_runs(i):
    sql = _doc_queries()[i]
    for profile in (real("nccl"), sample("gpt_train"), neuron_profile("cpu-fallback")):
        run_query(profile, sql, limit=50)


def test_agents_md_queries_return_what_they_say():
    q = _doc_queries()
    steps = run_query(real("nccl"), q[1]).table.to_pylist()
    assert [s["step"] for s in steps] == [4, 5, 6]
    idle = run_query(real("nccl"), q[4]).table.to_pylist()
    assert [r["step"] for r in idle] == [4, 5, 6]
    assert all(0 <= r["idle_ns"] <= r["step_ns"] for r in idle)
    assert all(r["busy_ns"] + r["idle_ns"] == r["step_ns"] for r in idle)
    kernels = run_query(real("nccl"), q[5]).table.to_pylist()
    assert kernels and all(k["calls"] > 0 for k in kernels)
    fallbacks = run_query(neuron_profile("cpu-fallback"), q[7]).table.to_pylist()
    assert fallbacks == [
        {"op_name": "aten::nonzero", "src_file": "/work/user/train.py", "src_line": 60,
         "calls": 4, "total_ns": 2_400_000}
    ]  # fmt: skip
    recompiles = run_query(neuron_profile("recompilation"), q[8]).table.to_pylist()
    assert [r["step"] for r in recompiles] == [1, 2, 3]


def test_agents_md_queries_on_a_captured_neuron_profile():
    q = _doc_queries()
    lines = run_query(sample("gpt_train"), q[2]).table.to_pylist()
    assert lines and lines[0]["device_ns"] and lines[0]["src_file"].endswith(".py")
    launched = run_query(sample("gpt_train"), q[6]).table.to_pylist()
    assert launched and all(r["launched_by"] == "launch" for r in launched)
    engines = {r["track"] for r in run_query(sample("gpt_train"), q[10]).table.to_pylist()}
    assert {"TensorE", "VectorE"} <= engines
    fallbacks = run_query(sample("fallback_float64"), q[7]).table.to_pylist()
    assert "aten::median" in {r["op_name"] for r in fallbacks}


def test_row_limit_truncates():
    res = run_query(real("nccl"), "SELECT id FROM events ORDER BY id", limit=7)
    assert res.table.column("id").to_pylist() == list(range(7))
    assert res.truncated
    small = run_query(real("nccl"), "SELECT count(*) AS n FROM events", limit=7)
    assert not small.truncated and small.table.column("n")[0].as_py() == 26935


def test_time_limit_interrupts():
    slow = "SELECT count(*) FROM events a, events b, events c"
    with pytest.raises(ExplorerError, match="time limit"):
        run_query(real("nccl"), slow, timeout_s=0.5)


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE x AS SELECT 1",
        "DELETE FROM events",
        "COPY (SELECT 1) TO '/tmp/ne-should-not-exist.csv'",
        "ATTACH '/tmp/ne-should-not-exist.db' AS x",
        "INSTALL httpfs",
        "SET enable_external_access = true",
        "SELECT 1; SELECT 2",
    ],
)
def test_writes_and_settings_are_refused(sql):
    with pytest.raises(ExplorerError):
        run_query(real("nccl"), sql)
    assert not Path("/tmp/ne-should-not-exist.csv").exists()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM read_parquet('{events}')",
    ],
)
def test_files_cannot_be_read(sql):
    profile = real("nccl")
    events = next(Path(profile.path).glob("events*"))
    with pytest.raises(ExplorerError, match="query"):
        run_query(profile, sql.format(events=events))


def test_sql_error_is_one_line():
    with pytest.raises(ExplorerError) as e:
        run_query(real("nccl"), "SELECT no_such_column FROM events")
    assert "\n" not in str(e.value) and "no_such_column" in str(e.value)


def test_describe_and_to_dict():
    res = run_query(real("nccl"), "DESCRIBE events")
    assert "start_ns" in res.table.column("column_name").to_pylist()
    d = run_query(real("nccl"), "SELECT 1 AS one").to_dict()
    assert d["columns"] == ["one"] and d["rows"] == [[1]] and d["truncated"] is False

"""The optional `graphs` table (the compiled graphs a capture keeps for `whatif --chip`) is a
table like the others: SQL (the CLI's query, the web's SQL page and its Parquet download) and the
CSV export see it, and a profile without one reads it as empty."""

from __future__ import annotations

import io
import json
import shutil

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from fastapi.testclient import TestClient
from test_analysis_profiles import sample

from neuron_explorer.analysis import run_query
from neuron_explorer.entry import main
from neuron_explorer.exporters import export
from neuron_explorer.model.schema import GRAPHS
from neuron_explorer.web.app import create_app

COLUMNS = [c.name for c in GRAPHS.columns]


def _kept(name: str) -> list[tuple]:
    """The graph rows a capture kept, read the way whatif --chip reads them."""
    table = sample(name).optional_table("graphs")
    return (
        []
        if table is None
        else sorted(zip(*(table.column(c).to_pylist() for c in COLUMNS), strict=True))
    )


def test_sql_reads_the_compiled_graphs_and_an_eager_profile_has_none():
    kept = _kept("gpt_compile")
    assert kept, "gpt_compile's capture keeps its NEFF graphs"
    got = run_query(sample("gpt_compile"), f"SELECT {', '.join(COLUMNS)} FROM graphs", limit=10_000)
    assert sorted(tuple(r.values()) for r in got.table.to_pylist()) == kept
    # every compiled kernel names a graph the table holds
    orphans = run_query(
        sample("gpt_compile"),
        """
        SELECT count(*) AS n FROM events
        WHERE json_extract_string(args, '$.neff_graph') IS NOT NULL
          AND json_extract_string(args, '$.neff_graph') NOT IN (SELECT graph FROM graphs)""",
    )
    assert orphans.table.to_pylist() == [{"n": 0}]
    assert _kept("gpt_train") == []
    none = run_query(sample("gpt_train"), "SELECT count(*) AS n FROM graphs").table.to_pylist()
    assert none == [{"n": 0}]


def test_query_command_answers_on_graphs(capsys):
    path = str(sample("gpt_compile").path)
    assert main(["query", path, "SELECT count(DISTINCT graph) AS g FROM graphs", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] == [[len({r[0] for r in _kept("gpt_compile")})]]


def test_csv_export_writes_graphs(tmp_path):
    for name in ("gpt_compile", "gpt_train"):
        result = export(sample(name), "csv", tmp_path / name)
        got = pacsv.read_csv(result.path / "graphs.csv",
                             convert_options=pacsv.ConvertOptions(
                                 column_types={c: "string" for c in COLUMNS if c != "op_index"}))  # fmt: skip
        assert got.column_names == COLUMNS
        assert result.counts["graphs.csv"] == got.num_rows == len(_kept(name))
        rows = sorted(zip(*(got.column(c).to_pylist() for c in COLUMNS), strict=True))
        assert rows == _kept(name)


def test_web_sql_page_and_download_see_graphs(tmp_path):
    root = tmp_path / "root"
    for name in ("gpt_compile", "gpt_train"):
        shutil.copytree(sample(name).path, root / name)
    client = TestClient(create_app(root, analysis_cache=tmp_path / "cache"))
    page = client.get("/api/p/gpt_compile/sql", params={"q": "SELECT count(*) AS n FROM graphs"})
    assert page.status_code == 200, page.text[:300]
    doc = page.json()
    assert "graphs" in doc["tables"] and "graphs" in {t["table"] for t in doc["schema"]}
    assert doc["result"]["rows"] == [[len(_kept("gpt_compile"))]]
    for name in ("gpt_compile", "gpt_train"):
        r = client.get(f"/api/p/{name}/tables/graphs.parquet")
        assert r.status_code == 200, r.text[:300]
        table = pq.read_table(io.BytesIO(r.content))
        assert table.column_names == COLUMNS and table.num_rows == len(_kept(name))

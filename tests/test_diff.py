"""One document per page for the CLI, the web and agents, on real profiles (two captures of
the samples on the neuron device): `diff --json` is /api/compare, `analyze --json` is the
findings page, `query --json` is the SQL page's result and `operators --json` the operator page,
each minus the web's file ids; the text of `diff` and `operators` fits 80 columns."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
from conftest import without_file_ids

from neuron_explorer.cli import main

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples" / "profiles"
A, B = "gpt_train", "gpt_compile"  # eager training and torch.compile of the same model


def run_cli(*argv: str, columns: int | None = None) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the CLI run in this process, `columns` wide."""
    out, err = io.StringIO(), io.StringIO()
    saved = os.environ.pop("COLUMNS", None)
    if columns:  # rich reads COLUMNS when it is not writing to a terminal
        os.environ["COLUMNS"] = str(columns)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        os.environ.pop("COLUMNS", None)
        if saved is not None:
            os.environ["COLUMNS"] = saved
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def diff_json(served_samples) -> dict:
    with contextlib.chdir(served_samples):  # the names as the web names them: the folders' names
        code, out, _ = run_cli("diff", A, B, "--json")
    assert code == 0
    return json.loads(out)


@pytest.mark.slow
def test_diff_json_is_the_web_compare(sample_json, diff_json):
    web = sample_json(f"/api/compare?a={A}&b={B}")
    assert any("file_id" in r for r in web["lines"])  # the web's decoration is there...
    assert without_file_ids(web) == diff_json  # ...and the only difference
    d = diff_json
    assert (d["a"], d["b"]) == (A, B)
    for table in ("ops", "kernels", "lines", "modules"):
        deltas = [abs(r["delta"]) for r in d[table]]
        assert deltas and deltas == sorted(deltas, reverse=True) and deltas[0] > 0, table
    sa, sb = d["steps"]["a"], d["steps"]["b"]
    # a median: one compile step moves a mean; one rank's whole steps are its steps
    assert d["step_ns_delta"] == round(sb["median_ns"] - sa["median_ns"])
    ja, jb = d["job_steps"]["a"], d["job_steps"]["b"]
    assert (ja["median_ns"], jb["median_ns"]) == (sa["median_ns"], sb["median_ns"])
    assert sa["count"] == len(sa["per_step"]) == 3
    # torch.compile of the same model: recompiles appear, and the module tree is the same one
    assert "recompilation" in {f["rule"] for f in d["findings"]["appeared"]}
    assert {m["path"] for m in d["modules"]} >= {"blocks.0.attn", "blocks.1.attn"}


@pytest.mark.slow
def test_diff_rows_are_each_sides_tables(served_samples, diff_json):
    """Each side of a delta row is that profile's own operator, kernel and module numbers."""
    for side, name in (("a", A), ("b", B)):
        with contextlib.chdir(served_samples):
            ops = json.loads(run_cli("operators", name, "--json")[1])["operators"]
            mods = json.loads(run_cli("modules", name, "--json")[1])["modules"]
        by_name = {o["name"]: o for o in ops}
        for r in diff_json["ops"]:
            if r[side]:
                o = by_name[r["name"]]
                assert r[side]["time_ns"] == o["host_self_ns"] + o["device_ns"]
                assert r[side]["count"] == o["count"]
        by_path = {m["path"]: m for m in mods}
        for r in diff_json["modules"]:
            if r[side]:
                assert r[side]["self_ns"] == by_path[r["path"]]["self_ns"]


@pytest.mark.slow
def test_diff_text_fits_80_columns_and_names_the_largest_changes(served_samples, diff_json):
    with contextlib.chdir(served_samples):
        code, out, _ = run_cli("diff", A, B, "--top", "5", columns=80)
    assert code == 0
    from rich.cells import cell_len

    assert max(cell_len(line) for line in out.splitlines()) <= 80
    for title in ("Ops", "Kernels", "Source lines", "Modules", "Findings that appeared",
                  "Findings that went"):  # fmt: skip
        assert title in out, title
    flat = " ".join(out.split())
    assert diff_json["kernels"][0]["name"] in flat and diff_json["modules"][0]["path"] in flat
    assert "recompilation" in flat


def test_diff_of_a_missing_profile_is_one_line(tmp_path):
    code, out, err = run_cli("diff", str(SAMPLES / A), str(tmp_path / "nope"))
    assert code == 2 and not out and len(err.strip().splitlines()) == 1 and "nope" in err


@pytest.mark.slow
def test_analyze_json_is_the_web_findings(served_samples, sample_json):
    code, out, _ = run_cli("analyze", str(served_samples / A), "--json")
    cli = json.loads(out)
    web = sample_json(f"/api/p/{A}/findings")
    assert code == 0 and cli["findings"] and web["findings"]
    assert without_file_ids(web) == cli
    lines = [x for f in web["findings"] for x in f["evidence"]["source_lines"] if x.get("file")]
    assert lines and all(x["file_id"] for x in lines)


def test_query_json_is_the_web_sql_result(served_samples, sample_json):
    q = "SELECT kind, count(*) AS n, sum(dur_ns) AS ns, 1 AS n FROM events GROUP BY 1 ORDER BY 3 DESC"
    code, out, _ = run_cli("query", str(served_samples / A), q, "--json")
    cli = json.loads(out)
    web = sample_json(f"/api/p/{A}/sql?q={q}")["result"]
    assert code == 0 and set(cli) == set(web)
    assert {**cli, "elapsed_ms": 0} == {**web, "elapsed_ms": 0}
    assert cli["columns"] == ["kind", "n", "ns", "n"]  # a repeated name keeps its column
    assert cli["row_count"] == len(cli["rows"]) > 3 and all(r[3] == 1 for r in cli["rows"])


def test_operators_json_is_the_web_page_and_the_text_fits(served_samples, sample_json):
    code, out, _ = run_cli("operators", str(served_samples / A), "--json")
    cli = json.loads(out)
    web = sample_json(f"/api/p/{A}/operators")
    assert code == 0 and {k: v for k, v in web.items() if k != "name"} == cli
    assert cli["roofline"]["peak_flops_per_s"] > 0 and cli["device_time_modeled"]
    code, text, _ = run_cli("operators", str(served_samples / A), "--top", "8", columns=80)
    from rich.cells import cell_len

    assert code == 0 and max(cell_len(line) for line in text.splitlines()) <= 80
    assert cli["operators"][0]["name"] in text and "roofline" in text
    code, text, _ = run_cli("operators", str(served_samples / A), "--op", "aten::mm", columns=80)
    assert code == 0 and "Kernels of aten::mm" in text and "models.py" in text

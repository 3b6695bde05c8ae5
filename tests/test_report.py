"""`neuron-explorer report`: the Markdown a pull request gets names the fallback sample's porting
problems at their lines, its JSON is the CLI's own documents, --against gives the deltas, and
bad input is a one-line error."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from neuron_explorer.entry import main as cli_main  # report is an agents command

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples" / "profiles"
FALLBACK = SAMPLES / "fallback_float64"


def run_cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(list(argv)) == 0
    return out.getvalue()


def line_of(text: str) -> int:
    """The line of samples/fallback_float64.py holding `text` (so edits to it move the test)."""
    lines = (ROOT / "samples" / "fallback_float64.py").read_text().splitlines()
    (n,) = [i for i, line in enumerate(lines, 1) if text in line]
    return n


@pytest.fixture(scope="module")
def fallback_md() -> str:
    return run_cli("report", str(FALLBACK))


def _section(md: str, title: str) -> str:
    parts = re.split(r"^## ", md, flags=re.M)
    (body,) = [p for p in parts if p.startswith(title)]
    return body


def test_fallback_report_names_its_three_porting_problems_at_their_lines(fallback_md):
    median, abs_, cast, item = (line_of(t) for t in
                                ("cap = residual.median()", "residual = (pred - yb).abs()",
                                 "model(xb * scale.float())", "losses.append(loss.item())"))  # fmt: skip
    ready = _section(fallback_md, "Readiness")
    fallbacks = re.search(r"^- CPU fallbacks: (.*)$", ready, re.M).group(1)
    for op, line in (("aten::median", median), ("aten::logical_or_", median), ("aten::sgn", abs_)):
        assert f"`{op}` at `fallback_float64.py:{line}`" in fallbacks
    downcasts = re.search(r"^- float64 downcasts: (.*)$", ready, re.M).group(1)
    assert f"at `fallback_float64.py:{cast}`" in downcasts
    syncs = re.search(r"^- Host syncs in the step: (.*)$", ready, re.M).group(1)
    assert f"`.item()` at `fallback_float64.py:{item}` (3 calls in 3 steps" in syncs
    problems = _section(fallback_md, "Porting problems")  # the findings, with lines and fixes
    assert "(`cpu-fallback`" in problems and "(`float64-downcast`" in problems
    assert (
        f"fallback_float64.py:{median}`" in problems and f"fallback_float64.py:{cast}`" in problems
    )
    assert problems.count("   - fix: ") >= 2
    assert fallback_md.index("## Porting problems") < fallback_md.index("## Performance findings")


def test_markdown_tables_are_well_formed(fallback_md):
    tables = [b for b in fallback_md.split("\n\n") if b.startswith("|")]
    assert len(tables) >= 2
    for table in tables:
        cells = {len(re.findall(r"(?<!\\)\|", r)) for r in table.splitlines()}
        assert len(cells) == 1, table
    assert "## Top lines" in fallback_md and "## Where the step time goes" in fallback_md
    assert "cost model" in fallback_md  # device times are modeled, and the report says so


def test_json_report_is_the_cli_documents():
    doc = json.loads(run_cli("report", str(FALLBACK), "--format", "json"))
    findings = json.loads(run_cli("analyze", str(FALLBACK), "--json"))["findings"]
    summary = json.loads(run_cli("summary", str(FALLBACK), "--json"))
    assert doc["findings"] == findings
    assert doc["readiness"] == summary["readiness"] and doc["breakdown"] == summary["breakdown"]
    assert doc["top_modules"] == summary["top_modules"]
    assert doc["top_model_lines"] == summary["top_model_lines"]
    q = ("SELECT src_file, src_line, CAST(sum(dur_ns) FILTER (WHERE kind = 'kernel') AS BIGINT) "
         "AS device_ns "
         "FROM events WHERE src_file IS NOT NULL GROUP BY ALL ORDER BY device_ns DESC NULLS LAST")  # fmt: skip
    res = json.loads(run_cli("query", str(FALLBACK), q, "--json"))
    top = dict(zip(res["columns"], res["rows"][0], strict=True))
    heaviest = max(doc["top_lines"], key=lambda r: r["device_ns"])
    assert (heaviest["file"], heaviest["line"], heaviest["device_ns"]) == (
        top["src_file"], top["src_line"], top["device_ns"])  # fmt: skip
    assert doc["against"] is None


def test_against_a_baseline_gives_the_deltas():
    from neuron_explorer.agents.report import render_markdown

    after, before = SAMPLES / "gpt_compile", SAMPLES / "gpt_train"
    doc = json.loads(run_cli("report", str(after), "--against", str(before), "--format", "json"))
    a = json.loads(run_cli("summary", str(before), "--json"))["step_stats"]
    b = doc["step_stats"]  # the summary's own (test_json_report_is_the_cli_documents)
    assert abs(doc["against"]["step_ns_delta"] - (b["median_ns"] - a["median_ns"])) <= 1
    was = {f["rule"] for f in json.loads(run_cli("analyze", str(before), "--json"))["findings"]}
    now = {f["rule"] for f in doc["findings"]}
    assert doc["against"]["findings_new"] == sorted(now - was)
    assert doc["against"]["findings_gone"] == sorted(was - now)
    ops = doc["against"]["ops"]
    assert ops and all(
        r["delta"] == r["b"].get("time_ns", 0) - r["a"].get("time_ns", 0) for r in ops
    )
    body = _section(render_markdown(doc), "Against `gpt_train`")  # what the md format prints
    assert "Median step" in body and "| Ops (largest change) |" in body
    assert "| Lines (largest change) |" in body


@pytest.mark.parametrize("argv", [["report", "/nonexistent/profile"],
                                  ["report", str(FALLBACK), "--against", "/nonexistent/base"],
                                  ["report", str(ROOT / "samples")]])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(argv, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("neuron-explorer: error:") and len(err.splitlines()) == 1

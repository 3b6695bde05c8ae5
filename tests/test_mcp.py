"""`neuron-explorer mcp`: the SDK's own stdio client starts the server as a subprocess over the
sample profiles and imported GPU traces, lists the tools, calls each one and checks the answers
against the CLI's --json output for the same profile; names that leave the served folder, and
SQL that reaches for files, are refused; answers stay bounded."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from neuron_explorer.entry import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples" / "profiles"
KINETO = ROOT / "tests" / "data" / "kineto-gpu"
GPU_TRACES = {  # served name -> real trace in tests/data/kineto-gpu (see its README)
    "alexnet": "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
    "compare_base": "trace_compare_base_base.json.gz",
    "compare_test": "trace_compare_test_test.json.gz",
}
CPU_TRACE = ROOT / "samples" / "traces" / "cpu_mlp_train.pt.trace.json.gz"  # with Python stacks
TOOLS = {"list_profiles", "summary", "findings", "sql", "timeline", "event", "source_line",
         "hotspots", "operators", "compare", "critical_path", "whatif", "report"}  # fmt: skip
NEURON, GPU = "fallback_float64", "alexnet"
ODD_NAME = "run 1 é+%2F-x"  # served by the web as it is (a space, non-ASCII, a literal %2F)


def cli_json(*argv: str):
    """What `neuron-explorer ARGV` prints, parsed (the CLI run in this process)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(list(argv)) == 0
    return json.loads(out.getvalue())


def cli_text(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(list(argv)) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of profiles: copies of samples/profiles and the GPU traces imported into it,
    plus a symlink that points out of it (which must never be served)."""
    from neuron_explorer.importers import import_traces

    root = tmp_path_factory.mktemp("served")
    for p in SAMPLES.iterdir():
        if p.is_dir():
            shutil.copytree(p, root / p.name)
    for name, trace in GPU_TRACES.items():
        import_traces([KINETO / trace], root / name)
    import_traces([CPU_TRACE], root / "cpu_mlp")
    shutil.copytree(SAMPLES / NEURON, root / ODD_NAME)
    shutil.copytree(SAMPLES / NEURON, root / "broken")
    (root / "broken" / "events.parquet").write_bytes(b"not parquet at all")
    outside = tmp_path_factory.mktemp("outside") / "secret_profile"
    shutil.copytree(SAMPLES / "gpt_train", outside)
    (root / "escape").symlink_to(outside, target_is_directory=True)
    return root


@pytest.fixture(scope="module")
def mcp(served: Path, tmp_path_factory: pytest.TempPathFactory):
    """A sync `call(tool, **args) -> (is_error, document or error text)` over one server
    subprocess; `.client` is the SDK client (used through `.portal`)."""
    yield from _mcp_over(served, tmp_path_factory.mktemp("cache"))


def _mcp_over(served: Path, cache: Path):
    from anyio.from_thread import start_blocking_portal
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "neuron_explorer", "mcp", str(served)], cwd=str(ROOT),
        env={"XDG_CACHE_HOME": str(cache), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    with start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(params)) as client:

            def call(tool: str, **args):
                r = portal.call(client.call_tool, tool, args)
                text = r.content[0].text
                return (True, text) if r.is_error else (False, json.loads(text))

            call.client, call.portal = client, portal  # type: ignore[attr-defined]
            yield call


def ok(result):
    is_error, doc = result
    assert not is_error, doc
    return doc


def rows_of(res: dict) -> list[dict]:
    """A query result's rows (lists, in column order) as dicts by column name."""
    return [dict(zip(res["columns"], r, strict=True)) for r in res["rows"]]


def test_lists_the_tools_each_saying_what_it_returns_and_its_units(mcp):
    tools = mcp.portal.call(mcp.client.list_tools).tools
    assert {t.name for t in tools} == TOOLS
    for t in tools:
        assert len(t.description) > 150 and "nanoseconds" in t.description, t.name
        assert t.annotations.read_only_hint is True
    res = mcp.portal.call(mcp.client.read_resource, "neuron-explorer://schema")
    assert json.loads(res.contents[0].text) == cli_json("schema", "--json")


def test_list_profiles_says_source_ranks_steps_devices(mcp, served):
    doc = ok(mcp("list_profiles"))
    rows = {r["name"]: r for r in doc["profiles"]}
    expected = {p.name for p in served.iterdir() if p.name != "escape"}
    assert set(rows) == expected  # the symlink out of the folder is not listed
    for name in (NEURON, GPU):
        s = cli_json("summary", str(served / name), "--json")
        assert rows[name]["source"] == s["source"]
        assert rows[name]["ranks"] == s["ranks"]
        count = (s["step_stats"] or {}).get("count", 0)
        assert (rows[name]["steps"] or {}).get("count", 0) == count
        assert rows[name]["devices"] == sorted({d["device"] for d in s["devices"]})


@pytest.mark.parametrize("name", [NEURON, GPU])
def test_summary_is_the_summary_command(mcp, served, name):
    doc = ok(mcp("summary", profile=name))
    cli = cli_json("summary", str(served / name), "--json")
    where = {k: cli.pop(k) for k in ("top_modules", "top_model_lines")}  # the hotspots tool's
    assert doc["summary"] == cli
    spots = ok(mcp("hotspots", profile=name, n=10))
    assert (spots["modules"], [r for r in spots["lines_by_level"]["lines"] if r["self_ns"]]) == (
        where["top_modules"],
        where["top_model_lines"],
    )
    if name == NEURON:
        assert doc["device_time_modeled"] and doc["summary"]["readiness"]["fallback_ops"]


@pytest.mark.parametrize("name", [NEURON, GPU])
def test_findings_are_the_analyze_command(mcp, served, name):
    doc = ok(mcp("findings", profile=name, limit=1000))
    cli = cli_json("analyze", str(served / name), "--json")["findings"]
    for f in doc["findings"]:  # the web adds a file id beside each path, for its source links
        for rows in f["evidence"].values():
            for row in rows if isinstance(rows, list) else ():
                if isinstance(row, dict):
                    row.pop("file_id", None)
    differ = [
        (f["rule"], k)
        for f, g in zip(doc["findings"], cli, strict=False)
        for k in f
        if f[k] != g.get(k)
    ]
    assert doc["findings"] == cli and doc["findings_total"] == len(cli) > 0, differ
    ready = ok(mcp("findings", profile=name, category="readiness", limit=2))
    expected = [f for f in cli if f["category"] == "readiness"]
    assert [f["title"] for f in ready["findings"]] == [f["title"] for f in expected][:2]
    assert ready["findings_total"] == len(expected)


def test_sql_is_the_query_command(mcp, served):
    q = "SELECT kind, count(*) AS n, sum(dur_ns) AS ns FROM events GROUP BY kind ORDER BY ns DESC"
    for name in (NEURON, GPU):
        res = ok(mcp("sql", profile=name, query=q))["result"]
        assert rows_of(res) == rows_of(cli_json("query", str(served / name), q, "--json"))


def test_timeline_window_holds_the_events_of_the_step(mcp, served):
    summary = ok(mcp("summary", profile=NEURON))
    step = summary["steps"]["per_step"][1]
    s, e = step["start_ns"], step["start_ns"] + step["dur_ns"]
    win = ok(mcp("timeline", profile=NEURON, start_ns=s, end_ns=e, width_px=300))["window"]
    q = f"SELECT count(*) AS n FROM events WHERE start_ns < {e} AND start_ns + dur_ns >= {s}"
    assert win["events"] == rows_of(cli_json("query", str(served / NEURON), q, "--json"))[0]["n"]
    rects = win["rects"]
    assert sum(rects["count"]) == win["events"] and len(rects["id"]) < win["events"]
    assert all(
        r_s < e and r_s + d >= s for r_s, d in zip(rects["start_ns"], rects["dur_ns"], strict=True)
    )


@pytest.mark.parametrize("name", [NEURON, GPU])
def test_event_has_its_flow_partner_and_line(mcp, served, name):
    q = ("SELECT k.id, k.flow_id, k.name, r.id AS launch_id, r.src_file, r.src_line FROM events k "
         "JOIN events r ON r.flow_id = k.flow_id AND r.layer = 'host' AND r.rank = k.rank "
         "WHERE k.layer = 'device' AND k.kind IN ('kernel', 'gpu_kernel') "
         "ORDER BY k.dur_ns DESC, k.id LIMIT 1")  # fmt: skip
    (k,) = rows_of(cli_json("query", str(served / name), q, "--json"))
    doc = ok(mcp("event", profile=name, event_id=k["id"]))
    assert doc["event"]["name"] == k["name"] and doc["event"]["flow_id"] == k["flow_id"]
    assert k["launch_id"] in {f["id"] for f in doc["flows"]}
    if k["src_file"]:
        assert (doc["source"]["file"], doc["source"]["line"]) == (k["src_file"], k["src_line"])
    assert "module" in doc["event"]
    launch = ok(mcp("event", profile=name, event_id=k["launch_id"]))
    assert k["id"] in {f["id"] for f in launch["flows"]}


def test_event_has_its_whole_stack(mcp, served):
    q = ("SELECT id, stack_id FROM events WHERE stack_id IS NOT NULL AND kind = 'op' "
         "ORDER BY dur_ns DESC, id LIMIT 1")  # fmt: skip
    (e,) = rows_of(cli_json("query", str(served / "cpu_mlp"), q, "--json"))
    doc = ok(mcp("event", profile="cpu_mlp", event_id=e["id"]))
    q = (f"SELECT depth, file, line, function, scope FROM stacks WHERE stack_id = {e['stack_id']} "
         "ORDER BY depth")  # fmt: skip
    stack = rows_of(cli_json("query", str(served / "cpu_mlp"), q, "--json"))
    frames = [{k: v for k, v in f.items() if k != "file_id"} for f in doc["stack"]]
    assert frames == stack and len(stack) > 1
    q = f"SELECT module, model_file, model_line FROM events WHERE id = {e['id']}"
    (where,) = rows_of(cli_json("query", str(served / "cpu_mlp"), q, "--json"))
    assert {k: doc["event"][k] for k in where} == where
    assert (doc["source"]["file"], doc["source"]["line"]) == (
        doc["event"]["src_file"],
        doc["event"]["src_line"],
    )


def test_hotspots_are_the_line_table(mcp, served):
    from reference_sql import LINES_SQL

    doc = ok(mcp("hotspots", profile=NEURON, n=5))
    ref = rows_of(cli_json("query", str(served / NEURON), LINES_SQL, "--json"))
    key = ("file", "line", "host_ns", "device_ns", "ops", "launches")
    assert [tuple(r[k] for k in key) for r in doc["top_lines"]] == [
        tuple(r[k] for k in key) for r in ref[:5]
    ]
    assert doc["files"][0]["has_source"]


@pytest.mark.parametrize("level", ["model", "user"])
def test_hotspots_by_module_and_line_are_the_modules_and_lines_commands(mcp, served, level):
    doc = ok(mcp("hotspots", profile="cpu_mlp", n=5, level=level))
    lines = cli_json("lines", str(served / "cpu_mlp"), "--level", level, "--top", "5", "--json")
    assert doc["lines_by_level"] == {"level": level, "lines": lines["lines"]} and lines["lines"]
    tree = cli_json("modules", str(served / "cpu_mlp"), "--json")["modules"]
    heaviest = sorted((m for m in tree if m["self_ns"]), key=lambda m: -m["self_ns"])[:5]
    assert doc["modules"] == heaviest and heaviest


def test_source_line_gives_its_code_and_time(mcp, served):
    top = ok(mcp("hotspots", profile=NEURON, n=1))["top_lines"][0]
    doc = ok(mcp("source_line", profile=NEURON, file=top["file"], line=top["line"], context=3))
    assert doc["this_line"]["host_ns"] == top["host_ns"]
    assert doc["this_line"]["device_ns"] == top["device_ns"]
    code = (SAMPLES.parent / Path(top["file"]).name).read_text().splitlines()
    assert doc["this_line"]["code"] == code[top["line"] - 1]
    assert [r["line"] for r in doc["listing"]] == list(range(top["line"] - 3, top["line"] + 4))
    q = (f"SELECT CAST(name AS VARCHAR) AS name, count(*) AS count FROM events WHERE "
         f"src_file = '{top['file']}' AND src_line = {top['line']} AND kind NOT IN ('step', 'python') "
         "GROUP BY ALL")  # fmt: skip
    ref = {
        r["name"]: r["count"] for r in rows_of(cli_json("query", str(served / NEURON), q, "--json"))
    }
    assert {o["name"]: o["count"] for o in doc["ops"]} == ref
    same = ok(mcp("source_line", profile=NEURON, file=doc["file_id"], line=top["line"]))
    assert same["this_line"] == doc["this_line"]


def test_operators_and_one_op(mcp, served):
    doc = ok(mcp("operators", profile=NEURON, n=3))
    assert len(doc["operators"]) == 3 and doc["operators_total"] > 3
    op = doc["operators"][0]["name"]
    detail = ok(mcp("operators", profile=NEURON, op=op))
    q = (f"SELECT count(*) AS n FROM events WHERE op_name = '{op}' AND layer = 'device' "
         "AND kind = 'kernel'")  # fmt: skip
    kernels = rows_of(cli_json("query", str(served / NEURON), q, "--json"))[0]["n"]
    assert sum(k["count"] for k in detail["kernels"]) == kernels > 0


def test_compare_is_the_difference_of_the_summaries(mcp, served):
    doc = ok(mcp("compare", a="compare_base", b="compare_test", n=5))
    a = cli_json("summary", str(served / "compare_base"), "--json")
    b = cli_json("summary", str(served / "compare_test"), "--json")
    assert (
        abs(doc["step_ns_delta"] - (b["step_stats"]["median_ns"] - a["step_stats"]["median_ns"]))
        <= 1
    )
    assert len(doc["ops"]) <= 5 and doc["ops"][0]["delta"] == (
        doc["ops"][0]["b"].get("time_ns", 0) - doc["ops"][0]["a"].get("time_ns", 0)
    )


def test_report_tool_is_the_report_command(mcp, served):
    doc = ok(mcp("report", profile="compare_test", against="compare_base"))
    assert doc["markdown"] == cli_text(
        "report", str(served / "compare_test"), "--against", str(served / "compare_base")
    )


BAD_NAMES = ["../" + NEURON, "..", ".", "/etc", "/etc/passwd", NEURON + "/../../etc",
             NEURON + "/timeline", "escape", "%2e%2e", str(SAMPLES / NEURON), NEURON + "\x00",
             "~", ""]  # fmt: skip
NAMED_TOOLS = [("summary", {}), ("findings", {}), ("sql", {"query": "SELECT 1"}),
               ("timeline", {}), ("event", {"event_id": 1}),
               ("source_line", {"file": "x.py", "line": 1}), ("hotspots", {}),
               ("operators", {}), ("report", {})]  # fmt: skip


def test_every_name_that_leaves_the_served_profiles_is_refused(mcp):
    for tool, extra in NAMED_TOOLS:
        for bad in BAD_NAMES:
            is_error, text = mcp(tool, profile=bad, **extra)
            assert is_error and "root:" not in text, (tool, bad, text[:200])
    for bad in BAD_NAMES:
        assert mcp("compare", a=bad, b=NEURON)[0] and mcp("compare", a=NEURON, b=bad)[0]
        if bad:  # an empty baseline is no baseline
            assert mcp("report", profile=NEURON, against=bad)[0]
    for bad in ("/etc/passwd", "../../../../etc/passwd", "../fallback_float64.py",
                str(ROOT / "samples" / "fallback_float64.py") + "/..", "0" * 12):  # fmt: skip
        is_error, text = mcp("source_line", profile=NEURON, file=bad, line=1)
        assert is_error and "root:" not in text, (bad, text[:200])


def test_sql_cannot_reach_files(mcp):
    for q in ("SELECT * FROM read_text('/etc/passwd')", "SELECT * FROM read_csv('/etc/passwd')",
              "COPY events TO '/tmp/h6_out.csv'", "ATTACH '/tmp/x.db' AS x",
              "SET enable_external_access = true", "SELECT 1; SELECT 2",
              "SELECT * FROM '/etc/passwd'", "SELECT * FROM glob('/etc/*')",
              f"SELECT * FROM read_parquet('{SAMPLES / 'gpt_train' / 'events.parquet'}')",
              "INSTALL httpfs", "LOAD httpfs"):  # fmt: skip
        is_error, text = mcp("sql", profile=NEURON, query=q)
        assert is_error and "root:" not in text, (q, text[:200])
    assert not Path("/tmp/h6_out.csv").exists()


@pytest.mark.slow  # the query process grows to its 1 GB limit before it is stopped
def test_sql_memory_is_bounded_as_the_webs(mcp):
    """The sql tool goes through the web's SQL route, so through its watched query process: a
    value DuckDB builds outside its own limit is one line, and the next query is answered."""
    from neuron_explorer.web.views import sql as sql_view

    is_error, text = mcp("sql", profile=NEURON, query="SELECT strlen(repeat('x', 600000000)) AS n")
    assert is_error and "\n" not in text.strip(), text[:300]
    assert (f"stopped: it needed more than {sql_view.QUERY_RSS >> 20} MB of memory" in text
            or "stopped after the time limit" in text), text[:300]  # fmt: skip
    after = ok(mcp("sql", profile=NEURON, query="SELECT 1 AS one"))
    assert rows_of(after["result"]) == [{"one": 1}]


def test_answers_are_bounded(mcp):
    from neuron_explorer.agents.bound import MAX_CHARS

    r = mcp.portal.call(mcp.client.call_tool, "sql",
                        {"profile": "gpt_train", "query": "SELECT * FROM events", "limit": 10000})  # fmt: skip
    text = r.content[0].text
    doc = json.loads(text)
    assert len(text) <= MAX_CHARS and doc["truncated"]["lists"]["result.rows"]["kept"] < 10000
    assert len(doc["result"]["rows"]) == doc["truncated"]["lists"]["result.rows"]["kept"]
    win = ok(mcp("timeline", profile="gpt_train", width_px=2000))
    assert len(json.dumps(win, separators=(",", ":"))) <= MAX_CHARS
    # too wide a window is reduced further on the server (narrower), not cut: every event is in
    assert "truncated" not in win and win["window"]["width_px"] < 2000
    assert sum(win["window"]["rects"]["count"]) == win["window"]["events"]


def test_bound_cuts_columns_together_and_says_what_it_cut():
    from neuron_explorer.agents.bound import bound

    doc = {"rects": {"a": list(range(5000)), "b": ["x" * 20] * 5000}, "small": [1, 2]}
    out = bound(json.loads(json.dumps(doc)), max_chars=20_000)
    kept = out["truncated"]["lists"]["rects"]["kept"]
    assert len(out["rects"]["a"]) == len(out["rects"]["b"]) == kept < 5000
    assert out["rects"]["a"] == list(range(kept)) and out["small"] == [1, 2]
    assert len(json.dumps(out, separators=(",", ":"))) <= 20_000
    assert bound(doc, max_chars=10**6) is doc  # under the limit: the same document, untouched


def _agents_md_query(number: int) -> str:
    text = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
    return re.findall(r"```sql\n(.*?)```", text, re.S)[number - 1]


def test_agents_md_top_kernels_and_per_rank_spread_answer_in_the_sql_tool(mcp):
    top = rows_of(ok(mcp("sql", profile=GPU, query=_agents_md_query(13)))["result"])
    kernels = ok(mcp("summary", profile=GPU))["summary"]["top_kernels"]
    assert (top[0]["name"], top[0]["total_ns"]) == (kernels[0]["name"], kernels[0]["total_ns"])
    spread = rows_of(ok(mcp("sql", profile=NEURON, query=_agents_md_query(15)))["result"])
    steps = ok(mcp("summary", profile=NEURON))["steps"]["per_step"]
    assert [(r["step"], r["ranks"], r["spread_ns"], r["slowest_ns"]) for r in spread] == [
        (s["step"], 1, 0, s["dur_ns"]) for s in steps
    ]


def test_agents_md_line_behind_most_device_idle(mcp):
    """Query 14 against the same sum done here from the device work and its launches."""
    res = ok(mcp("sql", profile=NEURON, query=_agents_md_query(14)))["result"]
    q = ("SELECT d.start_ns, d.dur_ns, coalesce(d.src_file, l.src_file) AS f, "
         "coalesce(d.src_line, l.src_line) AS n FROM events d LEFT JOIN (SELECT flow_id, "
         "any_value(src_file) AS src_file, any_value(src_line) AS src_line FROM events WHERE "
         "layer = 'host' AND flow_id IS NOT NULL AND src_file IS NOT NULL GROUP BY 1) l "
         "ON l.flow_id = d.flow_id WHERE d.layer = 'device' AND d.kind IN ('kernel', 'dma') "
         "ORDER BY d.start_ns, d.start_ns + d.dur_ns")  # fmt: skip
    work = rows_of(ok(mcp("sql", profile=NEURON, query=q, limit=10000))["result"])
    idle: dict[tuple, int] = {}
    busy_until = None
    for w in work:
        if busy_until is not None and w["start_ns"] > busy_until:
            key = (w["f"], w["n"])
            idle[key] = idle.get(key, 0) + w["start_ns"] - busy_until
        end = w["start_ns"] + w["dur_ns"]
        busy_until = end if busy_until is None else max(busy_until, end)
    (file, line), ns = max(idle.items(), key=lambda kv: kv[1])
    first = rows_of(res)[0]
    assert (first["src_file"], first["src_line"], first["idle_before_ns"]) == (file, line, ns)


@pytest.mark.parametrize("path", ["/nonexistent/profiles", str(ROOT / "docs")])
def test_mcp_on_a_bad_path_is_one_line_and_exit_2(path, capsys):
    assert cli_main(["mcp", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("neuron-explorer: error:") and len(err.splitlines()) == 1


def test_a_corrupt_profile_is_one_error_naming_its_file(mcp):
    rows = {r["name"]: r for r in ok(mcp("list_profiles"))["profiles"]}
    assert "events.parquet" in rows["broken"]["error"]
    for tool, extra in NAMED_TOOLS:
        is_error, text = mcp(tool, profile="broken", **extra)
        assert is_error and "events.parquet" in text and len(text.splitlines()) == 1, (tool, text)


def test_the_walkthrough_prompt(mcp):
    prompts = mcp.portal.call(mcp.client.list_prompts).prompts
    assert [p.name for p in prompts] == ["why_is_this_step_slow"]
    got = mcp.portal.call(mcp.client.get_prompt, "why_is_this_step_slow", {"profile": NEURON})
    text = got.messages[0].content.text
    assert NEURON in text and all(t in text for t in ("summary", "findings", "source_line"))


def test_a_profile_with_an_odd_name_is_served_under_that_name(mcp):
    assert ODD_NAME in {r["name"] for r in ok(mcp("list_profiles"))["profiles"]}
    assert ok(mcp("summary", profile=ODD_NAME))["name"] == ODD_NAME
    assert ok(mcp("findings", profile=ODD_NAME))["findings"]
    top = ok(mcp("hotspots", profile=ODD_NAME, n=1))["top_lines"][0]
    assert ok(mcp("source_line", profile=ODD_NAME, file=top["file"], line=top["line"]))["listing"]


def test_critical_path_and_whatif_match_the_cli(mcp, served):
    """The critical path and a replay, as the CLI's --json gives them; a speedup that names
    nothing is refused with the reason."""
    path = ok(mcp("critical_path", profile="gpt_train"))
    cli = cli_json("critical-path", str(served / "gpt_train"), "--json")
    assert (path["step_ns"], path["by_category"]) == (cli["step_ns"], cli["by_category"])
    assert path["segments_total"] == len(cli["segments"])
    w = ok(mcp("whatif", profile="gpt_train", speedup="aten::mm=2,aten::bmm=2", drop_syncs=True))
    c = cli_json("whatif", str(served / "gpt_train"), "--speedup", "aten::mm=2", "--speedup",
                 "aten::bmm=2", "--drop-syncs", "--json")  # fmt: skip
    assert (w["before_ns"], w["after_ns"]) == (c["before_ns"], c["after_ns"])
    is_error, text = mcp("whatif", profile="gpt_train", speedup="aten::nothing=2")
    assert is_error and "no device work" in text


@pytest.fixture(scope="module")
def hostile_mcp(tmp_path_factory: pytest.TempPathFactory):
    """The MCP server over the hostile profiles of tests/hostile_sizes.py (issue 29)."""
    import hostile_sizes

    root = tmp_path_factory.mktemp("hostile") / "profiles"
    hostile_sizes.write_all(root)
    yield from _mcp_over(root, tmp_path_factory.mktemp("cache"))


def test_hostile_profiles_are_one_line_errors_and_clipped_answers(hostile_mcp):
    """The tools call the web's routes, so they get its bounds: each hostile profile is one
    error line naming its file and problem, strings are clipped, and the server goes on."""
    from test_reliability_hostile import REFUSED, longest_string

    from neuron_explorer.web.responses import MAX_STRING_CHARS

    rows = {r["name"]: r for r in ok(hostile_mcp("list_profiles"))["profiles"]}
    for name, (file, problem) in REFUSED.items():
        assert problem in rows[name]["error"], rows[name]
        for tool, extra in NAMED_TOOLS:
            is_error, text = hostile_mcp(tool, profile=name, **extra)
            if name in ("huge_op_name", "corrupt_pages") and tool == "sql":  # SQL runs in a child
                continue  # bounded on its own (SELECT 1 reads nothing; it can find the long name)
            assert is_error and file in text and problem in text, (name, tool, str(text)[:300])
            assert len(text.splitlines()) == 1, (name, tool, text[:300])
    is_error, text = hostile_mcp("summary", profile="far_start")
    assert is_error and "cannot be analysed" in text and len(text.splitlines()) == 1
    assert ok(hostile_mcp("timeline", profile="far_start"))["window"]["events"] > 0
    for tool in ("summary", "operators", "timeline", "hotspots"):
        for name in ("long_op_name", "huge_manifest_string"):
            assert longest_string(ok(hostile_mcp(tool, profile=name))) <= MAX_STRING_CHARS + 40
    assert ok(hostile_mcp("summary", profile="good"))["name"] == "good"

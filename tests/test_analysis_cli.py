"""The summary, analyze and query commands as a user runs them, and docs/rules.md kept honest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_analysis_profiles import neuron_profile, real

from neuron_explorer.analysis import all_rules
from neuron_explorer.cli import main

RULES_MD = Path(__file__).resolve().parent.parent / "docs" / "rules.md"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _sections() -> dict[str, str]:
    text = RULES_MD.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.M)
    return {p.split("\n", 1)[0].strip(): p for p in parts[1:]}


@pytest.mark.parametrize("rule_id", sorted(all_rules()))
def test_every_rule_is_documented_with_its_thresholds(rule_id):
    section = _sections().get(rule_id)
    assert section, f"docs/rules.md has no section '## {rule_id}'"
    rule = all_rules()[rule_id]
    for word in ("Pattern", "Algorithm", "Fix"):
        assert f"**{word}.**" in section
    for name, value in rule.thresholds().items():
        assert f"| `{name}` | {value} |" in section, f"{rule_id}: {name} = {value} not in docs"


@pytest.mark.parametrize("rule_id", sorted(all_rules()))
def test_explain_every_rule(capsys, rule_id):
    code, out, _ = _run(capsys, "analyze", "--explain", rule_id, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["id"] == rule_id and "Algorithm:" in doc["doc"]
    assert doc["thresholds"] == all_rules()[rule_id].thresholds()


def test_analyze_json_and_text(capsys):
    profile = str(real("alexnet").path)
    code, out, _ = _run(capsys, "analyze", profile, "--json")
    doc = json.loads(out)
    assert code == 0
    # its device gaps are cuDNN start-up, not a saving (test_cudnn_start_up_is_not_a_saving)
    assert [f["rule"] for f in doc["findings"]] == ["host-device-copies"]
    code, out, _ = _run(capsys, "analyze", profile)
    assert code == 0 and "host-device-copies" in out and "fix:" in out


def test_analyze_says_which_change_each_saving_replays(capsys):
    """The text names the replayed change beside the saving, as the JSON's `replayed` does: on
    the launch-bound GPT sample, memory-bound-op's fused kernels replay to ~0."""
    from test_analysis_profiles import sample

    profile = str(sample("gpt_train").path)
    _code, out, _ = _run(capsys, "analyze", profile, "--json", "--rule", "memory-bound-op")
    (f,) = json.loads(out)["findings"]
    assert f["replayed"].startswith("these memory-bound kernels fused")
    code, out, _ = _run(capsys, "analyze", profile, "--rule", "memory-bound-op")
    flat = " ".join(out.split())
    assert code == 0 and f"replayed: {' '.join(f['replayed'].split())}" in flat


def test_analyze_one_rule_and_nothing_found_exit_zero(capsys):
    code, out, _ = _run(capsys, "analyze", str(real("ns_resolution").path), "--rule",
                        "device-idle-gaps", "--json")  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["findings"] == [] and doc["rules_run"] == ["device-idle-gaps"]
    code, out, _ = _run(capsys, "analyze", str(neuron_profile(None).path))
    assert code == 0 and "No problems found" in out


def test_analyze_list(capsys):
    code, out, _ = _run(capsys, "analyze", "--list")
    assert code == 0 and all(rid in out for rid in all_rules())


def test_summary_text_and_json(capsys):
    profile = str(real("nccl").path)
    code, out, _ = _run(capsys, "summary", profile)
    assert code == 0
    for heading in ("Devices", "Step-time breakdown", "Top host ops by self time",
                    "Top device kernels", "time per step"):  # fmt: skip
        assert heading in out
    # one breakdown adding up to 100%, the overlap apart; communication split from compute
    table = out[out.index("Step-time breakdown") : out.index("Top host ops")]
    above = table.split("│ steps")[0]
    assert abs(sum(float(x) for x in re.findall(r"([\d.]+)%", above)) - 100) < 0.5, above
    assert "communication (not hidden by compute)" in above
    assert "overlap, not added: communication hidden under compute" in table
    kernels = out[out.index("Top device kernels") :]
    assert "comm" in kernels and "computation" in kernels  # HTA's kernel types
    code, out, _ = _run(capsys, "summary", profile, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["step_stats"]["count"] == 3
    parts = doc["breakdown"]["parts"]
    assert sum(p["ns"] for p in parts) == doc["breakdown"]["steps_ns"]


def test_summary_says_the_last_step_is_partial(capsys):
    code, out, _ = _run(capsys, "summary", str(real("amd").path))
    assert code == 0 and "the last step (rank 0, step 2) is partial" in out


def test_summary_neuron_readiness(capsys):
    code, out, _ = _run(capsys, "summary", str(neuron_profile("cpu-fallback").path))
    assert code == 0
    assert "Trainium readiness" in out and "aten::nonzero" in out and "TensorE" in out


def test_query_formats(capsys):
    profile = str(real("nccl").path)
    sql = "SELECT kind, count(*) AS n FROM events WHERE layer = 'host' GROUP BY kind ORDER BY kind"
    code, out, _ = _run(capsys, "query", profile, sql, "--csv")
    lines = out.strip().splitlines()
    assert code == 0 and lines[0] == "kind,n" and "step,3" in lines
    code, out, _ = _run(capsys, "query", profile, sql, "--json")
    assert json.loads(out)["rows"][-1] == ["step", 3]
    code, out, err = _run(capsys, "query", profile, "SELECT id FROM events", "--limit", "3")
    assert code == 0 and "stopped at --limit 3" in err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["summary", "/no/such/profile"], "not a profile directory"),
        (["analyze", "/no/such/profile"], "not a profile directory"),
        (["analyze", "--explain", "nope"], "unknown rule"),
        (["query", "PROFILE", "DROP TABLE events"], "only read-only SELECT"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, argv, message):
    argv = [str(real("nccl").path) if a == "PROFILE" else a for a in argv]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and message in err and err.count("\n") == 1


def test_console_script_runs():
    res = subprocess.run(
        [sys.executable, "-m", "neuron_explorer", "analyze", "--explain", "cpu-fallback"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0 and "cpu-fallback" in res.stdout

"""User SQL in a bounded child process (analysis/sql_process.py): a value DuckDB builds outside
its own memory limit (`repeat('x', 600000000)`, 1.2 GB in one process before) is stopped at the
process's resident-memory limit with one line, the next query gets a fresh process, answers
equal the in-process ones, and a real server stays up and small under it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from test_web_security import serve

from neuron_explorer.analysis.sql import run_query
from neuron_explorer.analysis.sql_process import QueryProcess
from neuron_explorer.errors import ExplorerError
from neuron_explorer.model import Profile
from neuron_explorer.web.views import sql as sql_view

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "samples" / "profiles" / "gpt_train"  # a real capture on the neuron device
HUGE_STRING = "SELECT strlen(repeat('x', 600000000)) AS n"
LIMITS = {"limit": 1000, "memory_limit": "768MB", "max_bytes": 16 << 20}


def test_a_value_outside_duckdbs_limit_is_stopped_at_the_process_limit():
    profile = Profile.open(GPT)
    worker = QueryProcess()
    try:
        q = "SELECT kind, count(*) AS n, sum(dur_ns) AS ns FROM events GROUP BY kind ORDER BY kind"
        got = worker.run(profile, q, rss_limit=1 << 30, timeout_s=60, **LIMITS)
        want = run_query(profile, q, **LIMITS)
        assert got.to_dict()["rows"] == want.to_dict()["rows"] and got.table.equals(want.table)
        first = worker._proc
        t0 = time.monotonic()
        with pytest.raises(ExplorerError) as e:
            worker.run(profile, HUGE_STRING, rss_limit=128 << 20, timeout_s=60, **LIMITS)
        assert str(e.value) == (
            "query: stopped: it needed more than 128 MB of memory (the limit of one query)"
        )
        assert time.monotonic() - t0 < 30 and first.poll() is not None  # killed, not waited out
        # a fresh process answers the next query; errors stay one line, as in-process
        assert worker.run(profile, "SELECT 1 AS one", rss_limit=1 << 30, timeout_s=60,
                          **LIMITS).to_dict()["rows"] == [[1]]  # fmt: skip
        with pytest.raises(ExplorerError, match=r"^query: Parser Error: syntax error") as e:
            worker.run(profile, "SELEC 1", rss_limit=1 << 30, timeout_s=60, **LIMITS)
        assert "\n" not in str(e.value)
    finally:
        worker.close()


def test_an_idle_query_process_ends_and_the_next_query_starts_another():
    profile = Profile.open(GPT)
    worker = QueryProcess(idle_s=1.0)
    try:
        one = {"rss_limit": 1 << 30, "timeout_s": 60, **LIMITS}
        assert worker.run(profile, "SELECT 1 AS one", **one).to_dict()["rows"] == [[1]]
        first = worker._proc
        first.wait(timeout=20)  # it ends on its own
        assert worker.run(profile, "SELECT 2 AS two", **one).to_dict()["rows"] == [[2]]
        assert worker._proc is not first
    finally:
        worker.close()


def test_the_query_process_ends_with_its_server():
    """Killed mid-query, the server leaves no query process behind (it watches its parent)."""
    code = ("import sys, time; from neuron_explorer.model import Profile; "
            "from neuron_explorer.analysis.sql_process import QueryProcess; w = QueryProcess(); "
            "w.run(Profile.open(sys.argv[1]), 'SELECT 1', rss_limit=1 << 30, timeout_s=60, "
            "limit=10); print(w._proc.pid, flush=True); "
            "w.run(Profile.open(sys.argv[1]), 'SELECT count(*) FROM range(10000000000000)', "
            "rss_limit=1 << 30, timeout_s=600, limit=10)")  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", code, str(GPT)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    child = int(parent.stdout.readline())
    time.sleep(0.5)
    parent.kill()
    parent.wait()
    for _ in range(100):
        if not os.path.exists(f"/proc/{child}") or _zombie(child):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the query process outlived its server")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.sweep  # ~16 s
def test_a_real_server_stays_up_and_small_under_a_huge_string(tmp_path):
    root = tmp_path / "profiles"
    root.mkdir()
    shutil.copytree(GPT, root / "gpt")
    with serve(root, tmp_path) as (base, proc), httpx.Client(timeout=120) as c:
        t0 = time.monotonic()
        r = c.get(f"{base}/api/p/gpt/sql", params={"q": HUGE_STRING})
        took = time.monotonic() - t0
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err in (f"query: stopped: it needed more than {sql_view.QUERY_RSS >> 20} MB of "
                       "memory (the limit of one query)",
                       f"query: stopped after the time limit of {sql_view.TIMEOUT_S:g} s"), err  # fmt: skip
        assert took < sql_view.TIMEOUT_S + 10
        # the server itself never held the string, and answers the next query and its pages
        assert _peak_rss_mb(proc.pid) < 600
        q = "SELECT count(*) AS n FROM events"
        r = c.get(f"{base}/api/p/gpt/sql", params={"q": q})
        want = run_query(Profile.open(root / "gpt"), q).to_dict()["rows"]
        assert r.status_code == 200 and r.json()["result"]["rows"] == want
        assert c.get(f"{base}/api/p/gpt").status_code == 200


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "neuron_explorer", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip


@pytest.mark.slow
def test_the_query_command_runs_in_a_bounded_process_too():
    """`neuron-explorer query` goes through the same watched child: a huge value is one line
    and exit 2 at --memory, and its answers are the in-process ones (the CLI never holds them)."""
    t0 = time.monotonic()
    done = _cli("query", str(GPT), HUGE_STRING, "--memory", "512")
    assert done.returncode == 2 and done.stdout == "", done
    assert (
        done.stderr.endswith(
            "query: stopped: it needed more than 512 MB of memory (the limit of one query)\n"
        )
        and done.stderr.count("\n") == 1
    ), done.stderr
    assert time.monotonic() - t0 < 60
    q = "SELECT kind, count(*) AS n, sum(dur_ns) AS ns FROM events GROUP BY kind ORDER BY kind"
    done = _cli("query", str(GPT), q, "--json")
    want = run_query(Profile.open(GPT), q).to_dict()
    got = json.loads(done.stdout)
    assert done.returncode == 0 and got["rows"] == want["rows"] and got["types"] == want["types"]
    done = _cli("query", str(GPT), "SELEC 1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "query: Parser Error: syntax error" in done.stderr

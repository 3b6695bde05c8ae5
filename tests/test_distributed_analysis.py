"""What the analysis says about distributed programs a new user would profile, each captured
under real torchrun ranks on the neuron device (tests/ranks/analysis_worker.py): collectives
priced on the right buffer, steady-state figures without the ranks' start-up skew, waits that
never add up overlapping spans, and findings that name the real slow rank or say nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_distributed import torchrun

WORKER = Path(__file__).resolve().parent / "ranks" / "analysis_worker.py"


def capture(scenario: str, nproc: int, tmp: Path, *args: str, **kw) -> Path:
    out = tmp / scenario
    torchrun(WORKER, nproc, scenario, str(out), *args, **kw)
    return out


@pytest.mark.sweep  # two real ranks: ~7 s quiet (default suite < 15 min)
def test_all_gather_is_priced_on_the_gathered_buffer_and_reduce_scatter_on_its_input(tmp_path):
    """An all-gather moves (n-1)/n of the gathered buffer through each chip, whatever call
    issued it (c10d's `_allgather_base_` takes the output first, the functional op only the
    shard); a reduce-scatter moves (n-1)/n of its unreduced input."""
    from neuron_explorer.backend.costmodel import get_spec
    from neuron_explorer.backend.costmodel.collectives import collective_cost
    from neuron_explorer.model import Profile

    p = Profile.open(capture("pricing", 2, tmp_path))
    spec = get_spec(p.manifest.device_spec["name"]).collectives
    rows = (
        p.duckdb()
        .execute(
            "SELECT rank, name, op_name, dur_ns, args FROM events WHERE kind = 'collective' "
            "AND layer = 'device' ORDER BY rank, start_ns"
        )
        .fetchall()
    )
    shard = 4 * 2**20  # bytes a rank
    ops = {
        "c10d::_allgather_base_": "all_gather",
        "_c10d_functional::all_gather_into_tensor": "all_gather",
        "c10d::_reduce_scatter_base_": "reduce_scatter",
    }
    for rank in (0, 1):
        mine = {r[2]: r for r in rows if r[0] == rank}
        assert set(mine) == set(ops)
        for op, kind in ops.items():
            args = json.loads(mine[op][4])
            assert mine[op][1] == kind and args["bytes"] == 2 * shard, (op, args)
            cost = collective_cost(kind, 2 * shard, 2, spec)
            assert mine[op][3] == args["transfer_ns"] == cost.transfer_ns
            assert args["bus_bytes"] == shard  # (n - 1) / n of the whole buffer


def failed_capture(scenario: str, nproc: int, tmp: Path, *args: str) -> Path:
    """A job one of whose ranks fails: torchrun exits non-zero, the profile is still written."""
    import os
    import subprocess
    import sys

    from test_distributed import free_port

    out = tmp / scenario
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(WORKER), scenario,
           str(out), *args]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode != 0 and out.is_dir(), r.stderr[-3000:]
    return out


def _ending_everywhere(out: Path, capsys) -> tuple[str, str, dict]:
    """`summary` and `analyze` text and the Ranks page's JSON of a job's profile."""
    import shutil

    from fastapi.testclient import TestClient

    from neuron_explorer.entry import main
    from neuron_explorer.web.app import create_app

    texts = []
    for command in ("summary", "analyze"):
        assert main([command, str(out)]) == 0
        texts.append(" ".join(capsys.readouterr().out.split()))  # rich wraps long lines
    served = out.parent / "served"
    shutil.copytree(out, served / "job")
    client = TestClient(create_app(served, analysis_cache=out.parent / "cache"))
    page = client.get("/api/p/job/ranks")
    assert page.status_code == 200
    return texts[0], texts[1], page.json()


@pytest.mark.slow
def test_a_rank_that_raises_is_named_with_its_exception_and_its_partial_step_left_out(
    tmp_path, capsys
):
    """Rank 1 raises in its third recorded step; rank 0 then fails in the gradient all-reduce
    with gloo's "[.../pair.cc:NNN] Connection closed by peer" (whose brackets are not markup).
    The profile names rank 1's ValueError as the first failure, on every page."""
    from neuron_explorer.analysis.context import context
    from neuron_explorer.model import Profile

    out = failed_capture("crash", 2, tmp_path, "1")
    p = Profile.open(out)
    extra = p.manifest.extra
    assert p.manifest.ranks == (0, 1) and extra["missing_ranks"] == []
    assert extra["run_ended"]["rank"] == 1 and extra["run_ended"]["exception"] == "ValueError"
    assert set(extra["ranks_ended"]) == {"0", "1"}
    summary, analyze, page = _ending_everywhere(out, capsys)
    first = "Rank 1 failed first: ValueError: [rank 1] bad batch: 3 NaN labels"
    assert first in summary and first in analyze, (summary[:600], analyze[:600])
    assert "Rank 0 then ended by" in summary and "Traceback" not in summary
    assert page["job_ending"]["lines"][0].startswith(first)
    assert page["job_ending"]["ended"][0]["rank"] == 1
    # the step the failure cut short (step 3 on both ranks) is out of the step windows
    steps = context(p).steps().to_pylist()
    assert {(s["rank"], s["step"]) for s in steps} == {(r, s) for r in (0, 1) for s in (1, 2)}


@pytest.mark.sweep  # the rank that raises stays in the default run (default suite < 15 min)
def test_a_rank_killed_by_a_signal_is_named_missing(tmp_path, capsys):
    """SIGKILL on rank 1: it writes nothing; torchrun's SIGTERM reaches rank 0 while it writes
    the part that records its own error, and waits until that part is written."""
    from neuron_explorer.model import Profile

    out = failed_capture("kill", 2, tmp_path, "1")
    p = Profile.open(out)
    assert p.manifest.ranks == (0,) and p.manifest.extra["missing_ranks"] == [1]
    summary, analyze, page = _ending_everywhere(out, capsys)
    missing = "Rank(s) 1 wrote no profile: killed by a signal"
    assert missing in summary and missing in analyze
    assert page["job_ending"]["missing_ranks"] == [1]
    assert page["job_ending"]["lines"][0].startswith(missing)
    assert "failed first" not in summary  # rank 0's error follows from rank 1's death


def _doc_queries_on_duckdb(profile: Path) -> dict[str, list]:
    """docs/fleet.md's Spark SQL queries run by DuckDB over the profile's partitions (Spark's
    get_json_object and percentile spelled as DuckDB's): the page's definitions, checked
    against analyze in the default suite (tests/test_fleet.py runs them on Spark)."""
    import re

    import duckdb
    from test_fleet import doc_queries

    con = duckdb.connect()
    con.execute(
        f"CREATE VIEW events AS SELECT * FROM read_parquet('{profile}/events/*/*.parquet', "
        "hive_partitioning = true)"
    )
    out = {}
    for name, q in doc_queries().items():
        q = re.sub(r"\bget_json_object\(", "json_extract_string(", q)
        out[name] = con.execute(re.sub(r"\bpercentile\(", "quantile_cont(", q)).fetchall()
    return out


def check_straggler_named(profile: Path, slow: int) -> None:
    """The straggler rule names `slow` and only it, and docs/fleet.md's queries agree."""
    assert straggler_verdict(profile, slow), "the planted straggler is not named"


def straggler_verdict(profile: Path, slow: int) -> bool:
    """Whether the straggler rule names `slow`; it never names another rank, and docs/fleet.md's
    queries (SQL written apart from the rule) find the same."""
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.analysis.collectives import rank_step_waits
    from neuron_explorer.analysis.context import context
    from neuron_explorer.model import Profile

    p = Profile.open(profile)
    found = [f.evidence.metrics["rank"] for f in run_rules(p) if f.rule == "straggler"]
    steps = [(s.rank, s.step, s.dur_ns) for s in p.manifest.steps]
    assert found in ([slow], []), (found, steps)
    doc = _doc_queries_on_duckdb(profile)
    assert [r[0] for r in doc["stragglers"]] == found
    waits = {r: sum(s.wait_ns for s in v) for r, v in rank_step_waits(context(p)).items()}
    assert {r[0]: r[3] for r in doc["rank_steps"]} == waits
    if found:  # the others wait for it in the steady steps (the first carries the start skew)
        by_rank = rank_step_waits(context(p), steady=True)
        steady = {r: sum(s.wait_ns for s in v) for r, v in by_rank.items()}
        assert min(steady, key=steady.get) == slow, (steady, waits)
    return bool(found)


@pytest.mark.slow
def test_a_planted_straggler_of_2_ms_a_step_is_named(tmp_path):
    check_straggler_named(capture("straggler", 2, tmp_path, "1"), 1)


# At 4 ranks on 2 cores the simulating host's preemptions used to stay on the modeled clock and
# make another rank the last to arrive (1 capture of 10, at load 4-12; 7 of 10 with only the
# run-queue delay cut). Since the host clock keeps a thread's CPU time between two ops where it
# did not block (a VM's CPU stalls cut, not only run-queue delay) and bounds the stretches around
# autograd's hand-offs and collectives (docs/device.md), 10 of 10 at load 4.6-8.1.
@pytest.mark.sweep  # 10 captures at 2 ranks and 10 at 4: several minutes on two cores
@pytest.mark.timeout(1800)  # 15-30 s a 4-rank capture at load 5-8, several times that at 20
@pytest.mark.parametrize("nproc", [2, 4])
def test_a_planted_straggler_in_10_captures_is_named_and_never_mistaken(tmp_path, nproc):
    """Four ranks on two cores: a rank's host loses its CPU for longer than the planted 2 ms
    (run-queue delay, stalls of the virtual machine's CPU), and the host clock cuts it, so the
    rule names the planted rank in every capture, never the rank that lost its CPU."""
    named = [straggler_verdict(capture("straggler", nproc, tmp_path / str(i), str(nproc - 1),
                                       timeout=600), nproc - 1) for i in range(10)]  # fmt: skip
    assert all(named), named


@pytest.mark.slow
def test_a_symmetric_fsdp2_job_has_no_straggler_and_waits_never_add_up_past_the_steps(tmp_path):
    """FSDP2 issues its collectives on side streams: the host never blocks on them, so the rank
    that started recording first runs ahead for the whole capture and its device starts every
    collective when the last rank arrives. That wait is no time the rank lost: no straggler, no
    collective outlier, and no rank waits longer than its steps. The same kernel is modeled the
    same on every rank, one kernel at a time (kernels run in launch order on a NeuronCore)."""
    from neuron_explorer.analysis import get_rule, run_rules
    from neuron_explorer.analysis.collectives import rank_step_waits
    from neuron_explorer.analysis.context import context
    from neuron_explorer.analysis.summary import summarize
    from neuron_explorer.model import Profile

    p = Profile.open(capture("fsdp", 2, tmp_path))
    rules = {f.rule for f in run_rules(p)}
    assert not rules & {"straggler", "collective-outliers"}, rules
    # the early rank's device runs its collectives after its host steps ended: what each rank's
    # steps launched is the same, and collective-share sees no uneven ranks
    share = get_rule("collective-share")
    facts = share.measure(context(p))
    assert facts is not None and set(facts.launched) == {0, 1}
    assert facts.launched[0] == facts.launched[1] > 0, facts.launched
    assert facts.spread < share.SPREAD_RATIO
    for rank, steps in rank_step_waits(context(p)).items():
        assert all(0 <= s.wait_ns <= s.dur_ns for s in steps), (rank, steps)
    table = summarize(p).ranks_table
    assert table is not None
    for row in table.rows:
        assert row.wait_ns <= row.steps * row.median_step_ns * 2
    assert table.rows[0].compute_ns == table.rows[1].compute_ns > 0  # what the steps launched
    kernels = (
        p.duckdb()
        .execute(
            "SELECT rank, name, shapes, start_ns, dur_ns FROM events WHERE kind = 'kernel' AND "
            "layer = 'device' ORDER BY rank, start_ns"
        )
        .fetchall()
    )
    modeled: dict[tuple, set] = {}
    for rank in (0, 1):
        mine = [k for k in kernels if k[0] == rank]
        for a, b in zip(mine, mine[1:], strict=False):
            assert a[3] + a[4] <= b[3], (a, b)  # one kernel at a time
        for k in mine:
            modeled.setdefault((k[1], k[2]), set()).add(k[4])
    assert all(len(d) == 1 for d in modeled.values()), modeled  # same op, same modeled time


@pytest.mark.sweep  # two real ranks: ~9 s quiet (default suite < 15 min)
def test_steady_state_figures_leave_out_the_start_up_skew_and_say_so(tmp_path, capsys):
    """In a job the ranks start recording at different times; their first step holds that
    skew. The summary's mean step leaves each rank's first step out and says so; no outlier
    finding cites a first step."""
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.analysis.summary import summarize
    from neuron_explorer.entry import main
    from neuron_explorer.model import Profile

    out = capture("fsdp", 2, tmp_path)
    p = Profile.open(out)
    st = summarize(p).step_stats
    assert st is not None and st.count == 8
    firsts = {(r, min(s.step for s in p.manifest.steps if s.rank == r)) for r in (0, 1)}
    assert set(st.left_out) == firsts and st.startup_skew_ns > 0
    steady = [s.dur_ns for s in p.manifest.steps if (s.rank, s.step) not in firsts]
    assert st.mean_ns == pytest.approx(sum(steady) / len(steady))
    for f in run_rules(p):
        if f.rule in ("step-time-outliers", "collective-outliers"):
            cited = " ".join(h.label for h in f.evidence.ops)
            assert all(f"step {s} (rank {r})" not in cited for r, s in firsts), cited
    assert main(["summary", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "leave out each rank's first step" in text


@pytest.mark.sweep  # three real pipeline ranks: ~25 s quiet, ~50 s loaded (default suite < 15 min)
def test_a_3_to_1_pipeline_split_gets_pipeline_bubbles_with_pipeline_advice(tmp_path):
    """Six blocks on stage 0, two on stage 1 (GPipe, 4 micro-batches): the light stage waits
    to receive for much of each step. That is pipeline-bubbles' finding, with its advice
    (balance the stages), not a straggler with data-parallel advice."""
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.model import Profile

    found = {f.rule: f for f in run_rules(Profile.open(capture("pipeline", 2, tmp_path, "6")))}
    assert "straggler" not in found
    bubbles = found["pipeline-bubbles"]
    assert bubbles.evidence.metrics["busiest_rank"] == 0
    assert bubbles.evidence.metrics["idlest_rank"] == 1
    assert "stages" in bubbles.fix and "drop_last" not in bubbles.fix


def check_parallel_capture(out: Path, nproc: int) -> None:
    """Every rank is in the profile, its functional all-reduces on the device, and the ranks
    that share a batch agree on the loss."""
    from neuron_explorer.model import Profile

    p = Profile.open(out)
    assert p.manifest.ranks == tuple(range(nproc))
    rows = (
        p.duckdb()
        .execute(
            "SELECT rank, count(*) FROM events WHERE kind = 'collective' AND layer = 'device' "
            "AND op_name LIKE '_c10d_functional::%' GROUP BY rank ORDER BY rank"
        )
        .fetchall()
    )
    assert [r[0] for r in rows] == list(range(nproc)) and all(r[1] >= 3 for r in rows)
    losses = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(nproc)]
    assert all(len(x) == 4 for x in losses)
    assert losses[0] == losses[1]  # one tensor-parallel group computes one loss


@pytest.mark.sweep  # two real ranks: ~6 s quiet (default suite < 15 min)
def test_tensor_parallel_captures(tmp_path):
    """A functional collective whose result is used (DTensor's row-wise Linear) no longer
    crashes every rank under the profiler: its AsyncCollectiveTensor is waited for at once."""
    check_parallel_capture(capture("tp", 2, tmp_path), 2)


@pytest.mark.sweep  # four torchrun ranks on two cores: about a minute
def test_fsdp2_by_tensor_parallel_on_a_2_by_2_mesh_captures(tmp_path):
    check_parallel_capture(capture("fsdp_tp", 4, tmp_path, timeout=600), 4)


def check_zero(out: Path) -> None:
    """The job's profile holds both ranks and ZeRO's parameter broadcasts, and the optimizer
    state consolidated on rank 0 (loaded with map_location the device) has every parameter's
    Adam step count (1 warm-up step and 4 recorded)."""
    from neuron_explorer.model import Profile

    p = Profile.open(out)
    assert p.manifest.ranks == (0, 1)
    names = {r[0] for r in p.duckdb().execute(
        "SELECT DISTINCT name FROM events WHERE kind = 'collective' AND layer = 'device'"
    ).fetchall()}  # fmt: skip
    assert {"all_reduce", "broadcast"} <= names
    assert json.loads(Path(f"{out}.rank0.json").read_text()) == {str(i): 5.0 for i in range(4)}


@pytest.mark.sweep  # two real ranks: ~7 s quiet (default suite < 15 min)
def test_zero_redundancy_optimizer_with_ddp_captures_and_consolidates(tmp_path):
    check_zero(capture("zero", 2, tmp_path, timeout=120))


@pytest.mark.sweep  # 20 captures: a few minutes on two cores
def test_zero_captures_20_times_without_a_hang(tmp_path):
    """ZeRO broadcasts each rank's parameters from their owner: the root finishes its part
    without waiting, so it runs collectives ahead; the ranks' modeled-clock keys must outlive
    that (runtime/arrivals.py _clean). A hang shows as torchrun's timeout."""
    for i in range(20):
        check_zero(capture("zero", 2, tmp_path / str(i), timeout=120))

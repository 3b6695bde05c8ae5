"""The `neuron` torch.distributed backend under real torchrun processes on this machine's CPUs:
every collective, DDP, DTensor tensor-parallel, FSDP2 and pipeline-parallel training give
exactly what gloo gives on the CPU; one profile holds every rank; the cross-rank rules find a
planted straggler."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).resolve().parent / "ranks" / "collectives_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    script: Path, nproc: int, *args: str, timeout: int = 240, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `script` under torchrun on 127.0.0.1 (a free port), one CPU thread per rank. A rank
    that dies of a signal prints its threads' Python stacks (faulthandler) and, for a C++
    terminate, torch's C++ backtrace (TORCH_CUSTOM_TERMINATE): both go in the failure's text."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
        "PYTHONFAULTHANDLER": "1",
        "TORCH_CUSTOM_TERMINATE": "1",
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(script), *args]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, failure_report(r)
    return r


def failure_report(r: subprocess.CompletedProcess) -> str:
    """What a failed torchrun printed that says why: each rank's fatal-error dump and C++
    backtrace (which the launcher's own report would push out of a plain tail), then the tail."""
    dumps = [r.stderr[i : i + 3000] for i in _starts(r.stderr, "Fatal Python error")]
    dumps += [r.stdout[i : i + 3000] for i in _starts(r.stdout, "Unhandled exception caught")]
    return "\n".join([*dumps[:4], "--- stderr tail ---", r.stderr[-3000:]])


def _starts(text: str, marker: str) -> list[int]:
    out, i = [], text.find(marker)
    while i >= 0:
        out.append(i)
        i = text.find(marker, i + 1)
    return out


def results(mode: str, nproc: int, tmp: Path) -> list[dict]:
    out = tmp / mode
    out.mkdir()
    torchrun(WORKER, nproc, mode, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """The same program on CPU tensors over gloo."""
    return results("gloo", 2, tmp_path_factory.mktemp("gloo"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    ["neuron", pytest.param("mixed", marks=pytest.mark.sweep)],  # suite < 15 min
)
def test_every_collective_and_ddp_equal_gloo_on_the_cpu(mode, reference, tmp_path):
    got = results(mode, 2, tmp_path)
    for rank, (mine, ref) in enumerate(zip(got, reference, strict=True)):
        assert set(mine["collectives"]) == set(ref["collectives"])
        for name, value in ref["collectives"].items():
            assert mine["collectives"][name] == value, (mode, rank, name)
        assert mine["ddp"] == ref["ddp"], (mode, rank)
        assert mine["tensor_parallel"] == ref["tensor_parallel"], (mode, rank)
        if mode == "neuron":  # FSDP2 (fully_shard) and GPipe and 1F1B over 2 stages
            for name in ("fsdp2", "gpipe", "1f1b"):
                assert mine[name] == ref[name], (rank, name)
    # the reference itself is not trivial: ranks differ where they must
    assert (
        reference[0]["collectives"]["reduce_scatter_tensor"]
        != reference[1]["collectives"]["reduce_scatter_tensor"]
    )
    assert reference[1]["collectives"]["send_recv"] == [7.0, 7.0]
    # the stages hold different layers, the last one sees the losses; FSDP2's ranks train
    # on their own data into one model
    assert reference[0]["gpipe"]["losses"] == [[], []]
    assert len(reference[1]["gpipe"]["losses"][0]) == 4
    assert reference[0]["gpipe"]["weights"] != reference[1]["gpipe"]["weights"]
    assert reference[0]["fsdp2"]["losses"] != reference[1]["fsdp2"]["losses"]
    assert reference[0]["fsdp2"]["weights"] == reference[1]["fsdp2"]["weights"]


@pytest.mark.sweep  # four torchrun ranks on two cores: about a minute
def test_four_ranks_equal_gloo(tmp_path):
    got, ref = results("neuron", 4, tmp_path), results("gloo", 4, tmp_path)
    assert got == ref


PROFILE_WORKER = Path(__file__).resolve().parent / "ranks" / "ddp_profile_worker.py"
SLEEP_S = 0.06


@pytest.fixture(scope="module")
def straggler_profile(tmp_path_factory) -> Path:
    """A 2-rank DDP job captured by trace_handler in each rank; rank 1 sleeps in each step."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    torchrun(PROFILE_WORKER, 2, str(out), "1", str(SLEEP_S))
    return out


@pytest.mark.slow
def test_every_rank_lands_in_one_partitioned_profile(straggler_profile):
    from neuron_explorer.model import Profile

    p = Profile.open(straggler_profile)
    assert p.manifest.ranks == (0, 1)
    assert p.manifest.extra["world_size"] == 2 and p.manifest.extra["missing_ranks"] == []
    assert p.manifest.extra["run_id"]
    assert sorted(d.name for d in (straggler_profile / "events").iterdir()) == ["rank=0", "rank=1"]
    assert not (straggler_profile.parent / ".run.ranks").exists()  # the parts are gone
    assert {(s.rank, s.step) for s in p.manifest.steps} == {
        (r, s) for r in (0, 1) for s in range(1, 8)
    }
    ids = p.table("events", ["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids))  # ids renumbered per rank, unique in the whole profile


@pytest.mark.slow
def test_collectives_end_together_and_the_fast_rank_waits_for_the_straggler(straggler_profile):
    from neuron_explorer.model import Profile

    p = Profile.open(straggler_profile)
    rows = (
        p.duckdb()
        .execute(
            "SELECT rank, step, start_ns + dur_ns AS end_ns, args FROM events "
            "WHERE kind = 'collective' AND name = 'all_reduce' ORDER BY rank, start_ns"
        )
        .fetchall()
    )
    by_rank = {r: [row for row in rows if row[0] == r] for r in (0, 1)}
    assert len(by_rank[0]) == len(by_rank[1]) >= 3
    # the same all-reduce ends at one instant on every rank (one modeled clock)
    assert [r[2] for r in by_rank[0]] == [r[2] for r in by_rank[1]]
    # after the first step (the ranks reach the profiler at different times), rank 0 waits
    # for the sleeping rank 1 in each step's gradient all-reduce and rank 1 hardly waits
    waits = {
        r: [json.loads(row[3])["wait_ns"] for row in by_rank[r] if row[1] >= 2] for r in (0, 1)
    }
    assert len(waits[0]) == 6
    # each wait is about the sleep less rank 0's own extra work in that step (noisy on a loaded
    # host); DDP's all-reduce does not block rank 0's host, so rank 0 runs ahead into the next
    # step and part of one step's wait can land in the next one's
    assert all(w > 0.4 * SLEEP_S * 1e9 for w in waits[0][1:]), waits
    assert sum(waits[0]) > 0.7 * 6 * SLEEP_S * 1e9, waits
    assert all(w < 0.2 * SLEEP_S * 1e9 for w in waits[1]), waits
    transfer = json.loads(by_rank[0][0][3])
    # a tiny model's gradient bucket is under the mesh range: two hops whatever the group
    assert transfer["transfer_ns"] > 0 and transfer["algorithm"] == "mesh"
    assert transfer["link"] == "neuronlink" and transfer["world_size"] == 2


@pytest.mark.slow
def test_a_rank_that_never_writes_leaves_the_others_readable(tmp_path):
    from neuron_explorer.model import Profile

    out = tmp_path / "run"
    torchrun(PROFILE_WORKER, 2, str(out), "-1", "0", "1")
    p = Profile.open(out)
    assert p.manifest.ranks == (0,)
    assert p.manifest.extra["missing_ranks"] == [1]


@pytest.mark.slow
def test_straggler_and_collective_outliers_name_the_sleeping_rank(straggler_profile):
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.model import Profile

    found = {f.rule: f for f in run_rules(Profile.open(straggler_profile))}
    straggler = found["straggler"]
    assert straggler.evidence.metrics["rank"] == 1
    # the others' saving is the wait the sleep caused: about one sleep per slowed step
    assert straggler.saving_ns > 6 * 0.6 * SLEEP_S * 1e9
    outliers = found["collective-outliers"]
    assert outliers.evidence.metrics["wait_ns"] > 10 * outliers.evidence.metrics["transfer_ns"]
    assert all("rank 0" in h.label for h in outliers.evidence.ops)  # rank 0 waited


@pytest.mark.sweep  # two real ranks; the symmetric FSDP2 job's test stays in the default run
def test_no_straggler_when_the_ranks_keep_pace(tmp_path):
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.model import Profile

    out = tmp_path / "run"
    torchrun(PROFILE_WORKER, 2, str(out), "-1", "0")
    rules = {f.rule for f in run_rules(Profile.open(out))}
    assert "straggler" not in rules


def _rank_part(profile: Path, rank: int, out: Path, shift_ns: int, host: str) -> None:
    """Rank `rank` of a job's profile as its own part, its host clock ahead by shift_ns."""
    from dataclasses import replace

    import pyarrow.compute as pc

    from neuron_explorer.model import Profile
    from neuron_explorer.model.io import ProfileWriter

    p = Profile.open(profile)
    mine = lambda t: t.filter(pc.equal(t.column("rank"), rank))  # noqa: E731
    with ProfileWriter(out) as w:
        w.write_events(mine(p.table("events")))
        w.write_table("stacks", p.table("stacks"))
        w.write_table("counters", mine(p.table("counters")))
        w.commit(
            replace(
                p.manifest,
                origin_unix_ns=p.manifest.origin_unix_ns + shift_ns,
                host=host,
                ranks=(rank,),
                steps=tuple(s for s in p.manifest.steps if s.rank == rank),
            )
        )


@pytest.mark.slow
def test_a_rank_on_another_host_clock_is_aligned_on_the_collectives(straggler_profile, tmp_path):
    from neuron_explorer.model import Profile, combine

    job = tmp_path / "job"
    combine.parts_dir(job).mkdir()
    host = Profile.open(straggler_profile).manifest.host
    _rank_part(straggler_profile, 0, combine.part_path(job, 0), 0, host)
    _rank_part(straggler_profile, 1, combine.part_path(job, 1), 5_000_000_000, "other-host")
    p = Profile.open(combine.assemble(job, 2, "run-x"))
    assert p.manifest.extra["clock_offsets_ns"] == {"0": 0, "1": -5_000_000_000}
    ends = (
        p.duckdb()
        .execute(
            "SELECT rank, list(start_ns + dur_ns ORDER BY start_ns) FROM events "
            "WHERE kind = 'collective' AND layer = 'device' GROUP BY rank ORDER BY rank"
        )
        .fetchall()
    )
    assert ends[0][1] == ends[1][1]  # one instant per collective again
    assert p.manifest.extra["hosts"] == {"0": host, "1": "other-host"}


@pytest.mark.slow
def test_ranks_assembling_at_once_leave_one_whole_profile(straggler_profile, tmp_path):
    """Four ranks whose parts land together: exactly one writes the whole job and removes the
    parts, and a rank that comes to the lock after that finds its own part gone and leaves the
    whole profile as it is (it neither fails nor writes a partial one over it)."""
    from neuron_explorer.model import Profile, combine

    assembler = Path(__file__).resolve().parent / "ranks" / "assemble_worker.py"
    host = Profile.open(straggler_profile).manifest.host
    for attempt in range(4):
        job, ready = tmp_path / f"job{attempt}", tmp_path / f"ready{attempt}"
        ready.mkdir()
        combine.parts_dir(job).mkdir()
        for rank in range(4):
            _rank_part(straggler_profile, rank % 2, combine.part_path(job, rank), 0, host)
        procs = [
            subprocess.Popen(
                [sys.executable, str(assembler), str(job), "4", "run-x", str(rank), str(ready)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for rank in range(4)
        ]
        said = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, [e for _, e in said]
        assert [o for o, _ in said].count("wrote\n") == 1  # the job's profile, written once
        p = Profile.open(job)
        assert p.manifest.ranks == (0, 1, 2, 3) and p.manifest.extra["missing_ranks"] == []
        assert not combine.parts_dir(job).exists()


def test_ranks_write_their_parts_a_few_at_a_time_and_a_dead_writer_frees_its_slot(tmp_path):
    """A rank waits to write its part while another holds its writing slot (one per CPU this
    process may use, model/rank_parts.py), and gets it once that writer ends, however it ends;
    a rank of another slot writes meanwhile."""
    import threading

    from neuron_explorer.model import rank_parts

    job = tmp_path / "job"
    slots = len(os.sched_getaffinity(0))
    holder = subprocess.Popen(  # rank 0, writing its part
        [sys.executable, "-c", "import time; from pathlib import Path; "
         "from neuron_explorer.model import rank_parts\n"
         f"with rank_parts.writing(Path({str(job)!r}), 0):\n"
         "    print('in', flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "in\n"
    if slots > 1:
        with rank_parts.writing(job, 1):  # another slot: not held
            pass
    entered = threading.Event()

    def same_slot() -> None:
        with rank_parts.writing(job, slots):  # rank 0's slot
            entered.set()

    waiter = threading.Thread(target=same_slot, daemon=True)
    waiter.start()
    assert not entered.wait(1.0)  # rank 0 still writes
    holder.kill()
    holder.wait()
    assert entered.wait(60)
    waiter.join(60)


@pytest.mark.slow
def test_a_job_is_assembled_once_and_again_only_for_new_parts_while_no_rank_is_present(
    straggler_profile, tmp_path
):
    """Parts landing while another rank of the job is present write nothing; once no other
    rank is present (it died, or never profiles), the parts there are the job's profile, its
    missing ranks named, and that set of parts is not written twice."""
    from neuron_explorer.model import Profile, combine, rank_parts

    job = tmp_path / "job"
    host = Profile.open(straggler_profile).manifest.host
    combine.parts_dir(job).mkdir()
    present = subprocess.Popen(  # rank 3, alive, its part not written yet
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from neuron_explorer.model import rank_parts; "
         f"rank_parts.attend(Path({str(job)!r}), 3); print('in', flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert present.stdout is not None and present.stdout.readline() == "in\n"
    for rank in (0, 1):
        _rank_part(straggler_profile, rank, combine.part_path(job, rank), 0, host)
        assert not rank_parts.part_landed(job, 4, "run-x", rank)
    assert not job.exists() and not rank_parts.settle(job)
    present.kill()  # rank 3 dies without its part: the others are the job
    present.wait()
    assert rank_parts.settle(job) and not rank_parts.settle(job)  # once for this set of parts
    p = Profile.open(job)
    assert p.manifest.ranks == (0, 1) and p.manifest.extra["missing_ranks"] == [2, 3]
    _rank_part(straggler_profile, 0, combine.part_path(job, 2), 0, host)
    assert rank_parts.part_landed(job, 4, "run-x", 2)  # a new part, and no one else present
    assert Profile.open(job).manifest.extra["missing_ranks"] == [3]
    assert combine.parts_dir(job).exists()  # kept until every rank is in


@pytest.mark.slow
def test_capture_of_a_torchrun_launch_writes_one_profile_of_every_rank(tmp_path):
    """`neuron-explorer capture -o DIR -- torchrun ... script.py`: the script is unchanged (it
    has no profiler), every rank is captured, and the job's one profile names the straggler."""
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.model import Profile

    sample = Path(__file__).resolve().parents[1] / "samples" / "ddp_straggler.py"
    out = tmp_path / "job"
    cmd = [sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out), "--", "torchrun",
           "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           str(sample), "--steps", "6"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1",
           "TORCH_CUSTOM_TERMINATE": "1"}  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, failure_report(r)
    p = Profile.open(out)
    assert p.manifest.ranks == (0, 1) and p.manifest.extra["world_size"] == 2
    assert {s.rank for s in p.manifest.steps} == {0, 1}
    stragglers = [f for f in run_rules(p) if f.rule == "straggler"]
    assert [f.evidence.metrics["rank"] for f in stragglers] == [1], [
        (s.rank, s.step, s.dur_ns) for s in p.manifest.steps
    ]


def test_a_collective_issued_in_backward_gives_gloo_no_python_object():
    """backward() stashes a Python object in the thread-local state, which reaches the neuron
    device's autograd thread (where DDP issues its all-reduces) and, copied into a gloo Work,
    made gloo's thread wait for the GIL to drop it while the group's teardown joined that thread
    with the GIL held: a torchrun capture hung (runtime/work_tls.py). The host call runs without
    it, and the backward gets it back."""
    import threading

    import torch

    from neuron_explorer.backend.runtime.work_tls import without_python_tls

    seen: list[tuple[str, bool]] = []

    def stashed() -> bool:
        return torch._C._is_key_in_tls("context")

    def hook(grad):
        seen.append((threading.current_thread().name, stashed()))
        seen.append(("host call", without_python_tls(stashed)()))
        seen.append(("after", stashed()))
        return grad

    x = torch.ones(3, device="neuron", requires_grad=True)
    y = x * 2
    y.register_hook(hook)
    y.sum().backward()
    assert seen[0][0] != threading.main_thread().name  # the device's own autograd thread
    assert [s for _, s in seen] == [True, False, True]


@pytest.mark.sweep  # two real ranks: ~6 s quiet (default suite < 15 min)
def test_only_rank_0_profiling_never_hangs_and_names_rank_1_missing(tmp_path):
    from neuron_explorer.model import Profile

    out = tmp_path / "run"
    torchrun(Path(__file__).resolve().parent / "ranks" / "one_rank_profiles_worker.py", 2,
             str(out), timeout=180)  # fmt: skip
    p = Profile.open(out)
    assert p.manifest.ranks == (0,) and p.manifest.extra["missing_ranks"] == [1]
    n = p.duckdb().execute("SELECT count(*) FROM events WHERE kind = 'collective'").fetchall()
    assert n[0][0] >= 2


def _hta_overlap(spans_comm: list[tuple[int, int]], spans_comp: list[tuple[int, int]]) -> float:
    """HTA's comm/compute overlap (CommunicationAnalysis): the time communication kernels run
    while a computation kernel runs, over the communication kernels' time; written apart from
    analysis/ranks.py, by sweeping the merged intervals."""

    def merge(spans):
        out: list[list[int]] = []
        for s, e in sorted(spans):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return out

    comp = merge(spans_comp)
    both = sum(max(0, min(e, ce) - max(s, cs)) for s, e in merge(spans_comm) for cs, ce in comp)
    return both / sum(e - s for s, e in merge(spans_comm))


@pytest.mark.sweep  # two real ranks: ~10 s quiet; the default run's collective tests cover it
def test_an_async_all_reduce_runs_under_compute_and_blocks_only_its_consumer(tmp_path):
    """`async_op=True`: the host call costs a launch, the CC queue runs the all-reduce while a
    matmul runs, a kernel reading the reduced buffer waits for the all-reduce's end, and the
    per-rank table's overlap is HTA's comm/compute overlap figure on this profile."""
    from neuron_explorer.analysis.summary import summarize
    from neuron_explorer.model import Profile

    out = tmp_path / "run"
    torchrun(Path(__file__).resolve().parent / "ranks" / "overlap_worker.py", 2, str(out))
    p = Profile.open(out)
    launch = {int(r): c["launch_ns"] for r, c in p.manifest.extra["host_costs_ns"].items()}
    con = p.duckdb()
    rows = con.execute(
        "SELECT rank, step, layer, kind, name, start_ns, dur_ns, shapes, args FROM events "
        "WHERE step IS NOT NULL AND (kind = 'collective' OR (kind = 'runtime' AND name = "
        "'c10d::allreduce_') OR (kind = 'kernel' AND layer = 'device')) ORDER BY start_ns"
    ).fetchall()
    big = 64 * 2**20
    steps = sorted({(r[0], r[1]) for r in rows})
    assert len(steps) == 4  # 2 ranks x 2 steps
    together = []
    for rank, step in steps:
        mine = [r for r in rows if (r[0], r[1]) == (rank, step)]
        calls = [r for r in mine if r[3] == "runtime"]
        (async_call,) = [r for r in calls if json.loads(r[8])["bytes"] == big]
        args = json.loads(async_call[8])
        assert args["overlapped"] and async_call[6] == launch[rank]  # the host only launched it
        assert args["transfer_ns"] > 3 * launch[rank]
        blocking = [r for r in calls if not json.loads(r[8])["overlapped"]]
        assert len(blocking) == 2  # the step's first all-reduce and the last one
        assert all(r[6] >= json.loads(r[8])["transfer_ns"] for r in blocking)
        (cc,) = [r for r in mine if r[3] == "collective" and json.loads(r[8])["bytes"] == big]
        cc_end = cc[5] + cc[6]
        (matmul,) = [r for r in mine if r[4] == "mm" and r[7] == "[[512, 512], [512, 512]]"]
        both = min(cc_end, matmul[5] + matmul[6]) - max(cc[5], matmul[5])
        if both > 0:  # they ran together
            together.append((rank, step, both))
        (total,) = [r for r in mine if r[4] == "sum"]
        # the kernel reading the reduced buffer waits for the all-reduce, though the matmul
        # launched before it may end sooner
        assert total[5] >= cc_end
    # where a rank's host was descheduled (two cores, many processes) the other rank waits for
    # it and its matmul runs before the all-reduce starts; in a step without that they overlap
    assert together, rows
    table = summarize(p).ranks_table
    assert table is not None
    for row in table.rows:
        windows = con.execute(
            f"SELECT start_ns, start_ns + dur_ns FROM events WHERE kind = 'step' AND rank = {row.rank}"
        ).fetchall()

        def clipped(kind: str, rank: int = row.rank, windows: list = windows) -> list:
            # HTA times a collective kernel from its launch, spin-wait included: a neuron
            # collective from when this rank's queue could start it, its wait included
            wait = (
                "CAST(json_extract(args, '$.wait_ns') AS BIGINT)" if kind == "collective" else "0"
            )
            spans = con.execute(
                f"SELECT start_ns - {wait}, start_ns + dur_ns FROM events WHERE layer = 'device' "
                f"AND kind = '{kind}' AND rank = {rank}"
            ).fetchall()
            return [(max(s, ws), min(e, we)) for s, e in spans for ws, we in windows
                    if min(e, we) > max(s, ws)]  # fmt: skip

        hta = _hta_overlap(clipped("collective"), clipped("kernel"))
        assert row.overlap == pytest.approx(hta, abs=1e-3)
        assert row.overlap > 0  # the first rank to arrive too: it computes under its wait
        # the summary's overlap holds at least the matmul's share of the all-reduces
        ran_under = sum(both for r, _, both in together if r == row.rank)
        assert row.comm_overlap_ns >= ran_under - 1000


SAMPLE_JOB = Path(__file__).resolve().parents[1] / "samples" / "profiles" / "ddp_straggler"


def test_two_ranks_of_one_job_side_by_side(capsys):
    """`diff JOB@rank=0 JOB@rank=1`: each side is one rank of the job's profile, read in place;
    its JSON is analysis.ranks.compare_ranks's document."""
    from neuron_explorer.analysis.rank_compare import compare_ranks
    from neuron_explorer.entry import main
    from neuron_explorer.model import Profile
    from neuron_explorer.model.combine import rank_view

    job = Profile.open(SAMPLE_JOB)
    for rank in (0, 1):
        view = rank_view(job, rank)
        got = view.duckdb().execute("SELECT DISTINCT rank FROM events").fetchall()
        assert got == [(rank,)] and {s.rank for s in view.manifest.steps} == {rank}
    doc = compare_ranks(job, 0, 1).to_dict()
    assert doc["a"].endswith("@rank=0") and doc["b"].endswith("@rank=1")
    assert doc["steps"]["a"]["count"] == doc["steps"]["b"]["count"] == 3
    assert doc["ops"] and doc["kernels"]  # the same ops on both ranks, their times compared
    code = main(["diff", f"{SAMPLE_JOB}@rank=0", f"{SAMPLE_JOB}@rank=1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ops"] == doc["ops"] and out["step_ns_delta"] == doc["step_ns_delta"]
    assert main(["diff", f"{SAMPLE_JOB}@rank=0", f"{SAMPLE_JOB}@rank=7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no rank 7" in err and "Traceback" not in err


@pytest.mark.sweep  # two real ranks: ~6 s quiet (default suite < 15 min)
def test_a_barrier_is_a_collective_its_wait_measured_and_its_transfer_modeled(tmp_path):
    """`dist.barrier()` (on the CPU's tensor, gloo's own clock) is one collective on the CC
    lane of each rank: the rank that arrived first waits for the last (measured on the one
    clock), the transfer is a tiny all-reduce's, and the real gloo time is cut from the host."""
    from neuron_explorer.backend.costmodel import get_spec
    from neuron_explorer.backend.costmodel.collectives import collective_cost
    from neuron_explorer.model import Profile

    out = tmp_path / "run"
    torchrun(Path(__file__).resolve().parent / "ranks" / "barrier_worker.py", 2, str(out), "1",
             str(SLEEP_S))  # fmt: skip
    real = [json.loads((tmp_path / f"run.rank{r}.json").read_text()) for r in (0, 1)]
    for (in0, out0), (in1, out1) in zip(real[0], real[1], strict=True):
        assert min(out0, out1) >= max(in0, in1), real  # still a barrier: no rank left early
    p = Profile.open(out)
    cost = collective_cost("barrier", 0, 2, get_spec(p.manifest.device_spec["name"]).collectives)
    rows = (
        p.duckdb()
        .execute(
            "SELECT rank, layer, name, start_ns, dur_ns, args FROM events WHERE kind = 'collective' "
            "OR (kind = 'runtime' AND name LIKE 'c10d::%') ORDER BY rank, start_ns"
        )
        .fetchall()
    )
    device = {r: [x for x in rows if x[0] == r and x[1] == "device"] for r in (0, 1)}
    barriers = {r: [x for x in device[r] if x[2] == "barrier"] for r in (0, 1)}
    assert len(barriers[0]) == len(barriers[1]) == 2  # one per recorded step
    for b0, b1 in zip(barriers[0], barriers[1], strict=True):
        a0, a1 = json.loads(b0[5]), json.loads(b1[5])
        assert a0["seq"] == a1["seq"] and b0[3] + b0[4] == b1[3] + b1[4]  # ends together
        assert b0[4] == a0["transfer_ns"] == cost.transfer_ns > 0 and a0["algorithm"] == "tree"
        # rank 0 waits for the sleeping rank 1 (less what the load took from rank 0 itself)
        assert a0["wait_ns"] > 0.3 * SLEEP_S * 1e9 and a1["wait_ns"] < 0.2 * SLEEP_S * 1e9
    assert sum(json.loads(b[5])["wait_ns"] for b in barriers[0]) > 0.6 * 2 * SLEEP_S * 1e9
    # the numbering goes on: the all-reduce after each barrier is the next collective
    assert [json.loads(x[5])["seq"] for x in device[0]] == [
        json.loads(x[5])["seq"] for x in device[1]
    ]
    calls = {r: [x for x in rows if x[0] == r and x[2] == "c10d::barrier"] for r in (0, 1)}
    for c0, c1 in zip(calls[0], calls[1], strict=True):
        a0, a1 = json.loads(c0[5]), json.loads(c1[5])
        assert c0[4] >= a0["wait_ns"] + a0["transfer_ns"]  # the host waited for the last rank
        assert c1[4] < 0.2 * SLEEP_S * 1e9 <= a0["real_ns"]  # gloo's real time is cut


PLAIN_FSDP_WORKER = Path(__file__).resolve().parent / "ranks" / "plain_fsdp2_worker.py"


def test_a_plain_gloo_fsdp2_program_runs_with_the_package_as_without_it(tmp_path):
    """fully_shard with no mesh took the registered accelerator (neuron) for its mesh, so a
    gloo program of CPU tensors failed on its first parameter move (issue 28): with the device
    registered it now gets the CPU mesh it gets without the package, and the same losses."""
    runs = {}
    for autoload in ("1", "0"):
        out = tmp_path / f"autoload{autoload}"
        torchrun(PLAIN_FSDP_WORKER, 2, str(out), env={"TORCH_DEVICE_BACKEND_AUTOLOAD": autoload})
        runs[autoload] = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["registered"] for r in runs["1"]] == [True, True]
    assert [r["registered"] for r in runs["0"]] == [False, False]
    assert [r["mesh"] for r in runs["1"]] == ["cpu", "cpu"]
    assert [r["losses"] for r in runs["1"]] == [r["losses"] for r in runs["0"]]


FSDP_WORKER = Path(__file__).resolve().parent / "ranks" / "fsdp_overlap_worker.py"
FSDP_SLEEP_S = 0.05


@pytest.mark.sweep  # FSDP2 on two real ranks, twice: ~15 s quiet, ~35 s loaded (suite < 15 min)
def test_fsdp2_collectives_on_side_streams_overlap_compute_and_equal_gloo(tmp_path):
    """FSDP2 issues its all-gathers and reduce-scatters with async_op=False on side streams: a
    side stream maps to the collective queue, so each costs the host one launch, compute
    launched after it runs while it is still in flight (rank 1 sleeps before the last layer's
    backward, so rank 0's reduce-scatter waits for it), the kernel that copies an all-gather
    out starts after it (the stream's event), and training equals FSDP2 over gloo on the CPU."""
    from neuron_explorer.model import Profile

    runs = {}
    for mode in ("neuron", "gloo"):
        torchrun(FSDP_WORKER, 2, mode, str(tmp_path / mode), "1", str(FSDP_SLEEP_S))
        runs[mode] = [json.loads((tmp_path / f"{mode}.rank{r}.json").read_text()) for r in (0, 1)]
    assert runs["neuron"] == runs["gloo"]
    assert runs["gloo"][0]["losses"] != runs["gloo"][1]["losses"]  # each rank its own data
    p = Profile.open(tmp_path / "neuron")
    launch = {int(r): c["launch_ns"] for r, c in p.manifest.extra["host_costs_ns"].items()}
    rows = (
        p.duckdb()
        .execute(
            "SELECT d.rank, d.step, d.kind, d.name, h.start_ns, h.dur_ns, d.start_ns, "
            "d.start_ns + d.dur_ns, d.args FROM events d JOIN events h ON h.flow_id = d.flow_id "
            "AND h.rank = d.rank AND h.layer = 'host' AND h.kind = 'runtime' WHERE d.layer = "
            "'device' AND d.kind IN ('collective', 'kernel') AND d.step IS NOT NULL ORDER BY h.start_ns"
        )
        .fetchall()
    )
    for rank in (0, 1):
        mine = [r for r in rows if r[0] == rank]
        ccs = [r for r in mine if r[2] == "collective"]
        assert {r[3] for r in ccs} == {"all_gather", "reduce_scatter"}
        for c in ccs:  # on a side stream: the host launched it and went on
            assert json.loads(c[8])["stream"] == "side" and c[5] == launch[rank]
        for c in [r for r in ccs if r[3] == "all_gather"]:
            after = [r for r in mine if r[4] > c[4] and r[3] == "split_with_sizes_copy"]
            assert after and after[0][6] >= c[7]  # its copy-out waits for it
    # compute rank 0 launched after a collective ran before that collective ended: the host
    # was not held, as it was when FSDP2's collectives blocked it
    mine = [r for r in rows if r[0] == 0]
    in_flight = [
        (c[3], k[3])
        for c in mine
        if c[2] == "collective"
        for k in mine
        if k[2] == "kernel" and k[3] in ("mm", "threshold_backward") and k[4] > c[4] and k[6] < c[7]
    ]
    assert any(name == "reduce_scatter" for name, _ in in_flight), in_flight


def test_a_side_stream_is_a_stream_of_its_own_whose_events_the_engines_wait_for():
    """torch.neuron.Stream() is not the default stream; while one is current the collectives
    see it (runtime/queues.side); under the profiler, an event of a side stream carries the
    stream's tail, and a kernel launched after the default stream waits on it starts no
    earlier, while one launched before does not wait."""
    import torch

    from neuron_explorer.backend import events
    from neuron_explorer.backend.runtime import model, queues

    side, default = torch.neuron.Stream(), torch.neuron.default_stream()
    assert side != default and torch.neuron.current_stream() is default
    with torch.neuron.stream(side):
        assert torch.neuron.current_stream() is side and queues.side is side
    assert queues.side is None
    x = torch.ones(64, 64, device="neuron")
    try:
        with torch.profiler.profile():
            events.drain()
            x @ x
            side.tail_ns = queues.compute_tail_ns() + 5_000_000  # as a collective on it would
            event = side.record_event()
            assert event.device_ns == side.tail_ns
            default.wait_event(event)
            x + 1
            model.schedule_pending()
        starts = {e.name: e.device_start_ns - model.origin_ns for e in events.drain()
                  if e.kind == "kernel"}  # fmt: skip
    finally:
        queues.pending.pop(queues.FLOOR, None)  # no later test inherits the floor
    assert starts["mm"] < event.device_ns <= starts["add"]


def test_a_neuron_stream_is_a_torch_stream_that_torchs_own_apis_take():
    # torch.accelerator.set_stream, tensor.record_stream and torch.Stream(device="neuron")
    # work with torch.neuron's streams, and both sides agree on the current one (issue 28)
    import torch

    from neuron_explorer.backend.runtime import guard, queues

    if guard.kind != "native":
        pytest.skip("torch's current stream is the C++ guard's")

    side, default = torch.neuron.Stream(), torch.neuron.default_stream()
    assert isinstance(side, torch.Stream) and side.device == torch.device("neuron", 0)
    assert side.stream_id != default.stream_id == 0
    torch.accelerator.set_stream(side)
    try:
        assert torch.neuron.current_stream() is side and queues.side is side
        assert torch.accelerator.current_stream().stream_id == side.stream_id
    finally:
        torch.accelerator.set_stream(default)
    assert torch.neuron.current_stream() is default and queues.side is None
    made_by_torch = torch.Stream(device="neuron")
    with torch.neuron.stream(made_by_torch):
        assert torch.neuron.current_stream().stream_id == made_by_torch.stream_id
        assert torch.accelerator.current_stream().stream_id == made_by_torch.stream_id
        assert queues.side is torch.neuron.current_stream()
    assert torch.accelerator.current_stream().stream_id == 0 and queues.side is None
    x = torch.ones(3, device="neuron")
    x.record_stream(side)
    assert torch.equal((x + 1).cpu(), torch.full((3,), 2.0))

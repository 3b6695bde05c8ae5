"""`neuron-explorer capture --model-ranks N` (docs/device.md, "Many ranks on one machine"): DDP's
collectives priced as a real 8-rank torchrun's rank 0 measured them; DTensor tensor parallelism
runs modeled, its collectives priced for the group of N; GPipe and 1F1B run modeled with the
bubble of a real torchrun, and a schedule of several stages a rank stops with one clear line.
(FSDP2 modeled over 4 ranks: tests/test_device_shapes_only.py, beside the real 4-rank job.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each case captures a small job (seconds)

WORKER = Path(__file__).resolve().parent / "ranks" / "model_ranks_parallel_worker.py"


SCHEDULE = ["--wait", "1", "--warmup", "1", "--active", "1"]  # the third step: costs measured


def capture(out: Path, mode: str, ranks: int, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEURON_EXPLORER_SHAPES_ONLY": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out),
                           *SCHEDULE, "--model-ranks", str(ranks), "--", "python", str(WORKER),
                           mode, *args],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip


def test_tensor_parallel_shards_over_the_modeled_ranks_and_prices_its_collectives(tmp_path):
    from neuron_explorer.model import Profile

    proc = capture(tmp_path / "tp", "tp", 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tp local weight (256, 256)" in proc.stdout  # 1024 output rows over 4 ranks
    rows = (
        Profile.open(tmp_path / "tp")
        .duckdb()
        .execute(
            "SELECT json_extract(args, '$.world_size')::INT, dur_ns FROM events"
            " WHERE kind = 'collective'"
        )
        .fetchall()
    )
    # RowwiseParallel's all-reduce of the output, forward and backward's input grads
    assert rows and all(size == 4 and dur > 0 for size, dur in rows)
    extra = json.loads((tmp_path / "tp" / "manifest.json").read_text())["extra"]
    assert extra["model_ranks"] == {"world_size": 4, "executed": [0], "copies": [1, 2, 3]}


def _gradient_waits(profile_dir: Path, rank: int = 0) -> list[int]:
    """A rank's waits in its receives of the recorded step, in order (ns): rank 0's for
    stage 1's gradients, a later stage's for its activations and gradients."""
    from neuron_explorer.model import Profile

    rows = (
        Profile.open(profile_dir)
        .duckdb()
        .execute(
            "SELECT json_extract(args, '$.wait_ns')::BIGINT FROM events WHERE rank = ?"
            " AND kind = 'collective' AND layer = 'device' AND op_name = 'c10d::recv_'"
            " ORDER BY start_ns",
            [rank],
        )
        .fetchall()
    )
    return [r[0] for r in rows]


def _bubbles(profile_dir: Path) -> list[int]:
    """Rank 0's device idle time before each gradient it receives in the recorded step (ns),
    from the previous one's arrival (the first: from its first kernel): its wait in the
    receive, and any gap its host left before it. A receive's wait alone moves with the
    host's speed on either side: a host late to launch the backward after a gradient arrives
    idles the device in that gap, and the next gradient, arriving when it would have, finds a
    shorter wait (a modeled run under two busy loops: 13.2 ms after an 8.3 ms gap, 21.3 ms
    without; a real one 17.8 ms after a 3.3 ms gap). Their sum over an interval is the time
    the device waited for its peers, whatever the host did."""
    from neuron_explorer.model import Profile

    rows = (
        Profile.open(profile_dir)
        .duckdb()
        .execute(
            "SELECT start_ns, start_ns + dur_ns, op_name = 'c10d::recv_' FROM events"
            " WHERE rank = 0 AND layer = 'device' AND kind IN ('kernel', 'collective')"
            " ORDER BY start_ns"
        )
        .fetchall()
    )
    bubbles, idle, end = [], 0, rows[0][1]
    for start, stop, received in rows[1:]:
        idle += max(0, start - end)
        end = max(end, stop)
        if received:  # the receive starts when its gradient arrives
            bubbles.append(idle)
            idle = 0
    return bubbles


def _late_starts(real: Path, ranks: int) -> int:
    """How late the real ranks after rank 0 came to the recorded step (ns): each one's first
    activation received after it was sent, which only a host late to post the receive makes
    (a rank whose Python started the step late). Each delays rank 0's first gradient by as
    much, and a modeled job's copies have no host: a GPipe over 4 ranks whose rank 1 came
    22.9 ms late had rank 0 idle 118.2 ms before its first gradient, 95.2 without it, where
    the other runs were 95.6 and the model 94.5."""
    from neuron_explorer.model import Profile

    db = Profile.open(real).duckdb()
    sql = (
        "SELECT start_ns, start_ns + dur_ns FROM events WHERE rank = ? AND layer = 'device'"
        " AND kind = 'collective' AND op_name = ? ORDER BY start_ns LIMIT 1"
    )
    late = 0
    for rank in range(1, ranks):
        sent = db.execute(sql, [rank - 1, "c10d::send"]).fetchone()
        received = db.execute(sql, [rank, "c10d::recv_"]).fetchone()
        late += max(0, received[0] - sent[1])
    return late


def _real_pipeline(out: Path, kind: str, ranks: int, mode: str = "pp", *args: str) -> None:
    from test_distributed import free_port

    env = {**os.environ, "NEURON_EXPLORER_SHAPES_ONLY": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "neuron_explorer", "capture", "-o", str(out),
                           *SCHEDULE, "--", "torchrun", f"--nproc-per-node={ranks}",
                           "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                           str(WORKER), mode, kind, *args],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


def _kernel_busy(profile_dir: Path, rank: int, op: str = "%") -> int:
    """A rank's device busy time in the recorded step (ns): the sum of its kernels (of `op`)."""
    from neuron_explorer.model import Profile

    sql = "SELECT sum(dur_ns) FROM events WHERE rank = ? AND kind = 'kernel' AND op_name LIKE ?"
    return int(Profile.open(profile_dir).duckdb().execute(sql, [rank, op]).fetchone()[0])


@pytest.mark.parametrize(
    "kind,ranks",
    [
        pytest.param("gpipe", 2, marks=pytest.mark.sweep),  # a real 2-rank torchrun: ~12 s quiet
        pytest.param("1f1b", 2, marks=pytest.mark.sweep),
        pytest.param("gpipe", 4, marks=pytest.mark.sweep),  # four real ranks: a minute
        pytest.param("1f1b", 4, marks=pytest.mark.sweep),
    ],
)
def test_a_modeled_pipeline_has_the_bubble_of_a_real_torchrun(tmp_path, kind, ranks):
    """`--model-ranks N` runs stage 0 of an N-stage schedule, the other stages copies of it
    (backend/pipeline_ranks.py), whose backwards add their gradients to the earlier
    micro-batches' as rank 0 does and compute the gradient of their input, which stage 0
    never does. Against a real N-rank torchrun of the same script: rank 0's idle device
    before its first gradient (the fill and drain) within 12%, the real ranks' late starts
    taken out (`_late_starts`), and before all its gradients of the step within 10%
    (`_bubbles`: not the receives' waits, which its host's speed moves);
    each copy's busy time beyond stage 0's (its input's gradient, and the last one's loss and
    merged outputs: modeled kernels on both sides) within 1% of what the real rank's kernels
    add to rank 0's, and its waits after its first action within 10% of the real rank's
    (or 2% of its busy time, where the real rank waits next to nothing)."""
    modeled, real = tmp_path / "modeled", tmp_path / "real"
    proc = capture(modeled, "pp", ranks, kind)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _real_pipeline(real, kind, ranks)
    got, want = _bubbles(modeled), _bubbles(real)
    assert len(got) == len(want) == 4  # one gradient a micro-batch
    want[0] -= _late_starts(real, ranks)
    assert want[0] > 0 and abs(got[0] - want[0]) <= 0.12 * want[0], (got, want)
    assert abs(sum(got) - sum(want)) <= 0.10 * sum(want), (got, want)
    model = json.loads((modeled / "manifest.json").read_text())["extra"]["model_ranks"]
    assert model["executed"] == [0]
    pipeline = model["pipeline"]
    copies = {c["stage"]: c for c in pipeline["copies"]}
    assert sorted(copies) == list(range(1, ranks))
    real_rank0 = _kernel_busy(real, 0)
    for stage, copy in copies.items():
        added = copy["busy_ns"] - pipeline["stage0_busy_ns"]
        real_added = _kernel_busy(real, stage) - real_rank0
        assert real_added > 0 and abs(added - real_added) <= 0.01 * real_added, (stage, copy)
        real_waits = sum(_gradient_waits(real, stage)[1:])  # the first: the fill
        slack = max(0.10 * real_waits, 0.02 * copy["busy_ns"])
        assert abs(copy["wait_ns"] - real_waits) <= slack, (stage, copy, real_waits)


def _collective_waits(profile_dir: Path, name: str, rank: int = 0) -> int:
    """A rank's waits in its `name` collectives of the recorded step (ns)."""
    from neuron_explorer.model import Profile

    sql = ("SELECT coalesce(sum(json_extract(args, '$.wait_ns')::BIGINT), 0) FROM events"
           " WHERE rank = ? AND kind = 'collective' AND layer = 'device' AND name = ?")  # fmt: skip
    return int(Profile.open(profile_dir).duckdb().execute(sql, [rank, name]).fetchone()[0])


@pytest.mark.sweep  # a real 4-rank torchrun (pp2 x dp2): ~20 s quiet (default suite < 15 min)
def test_fsdp2_inside_a_pipeline_stage_accumulates_its_gradients_as_rank_0_did(tmp_path):
    """GPipe over a 2 x 2 mesh (pp x dp), each stage's module sharded by FSDP2 over its dp
    ranks: a stage's backwards accumulate the unsharded gradients (the schedule turns the
    gradient sync off until its last), full-size `add_`s that the sharded parameters' `.grad`
    (None in the step) does not show, priced as the real rank 0's to the nanosecond. The copy of stage 1 adds them to its micro-batches after
    the first as rank 0 did, so rank 0's idle device before its later gradients is the real
    rank 0's within 15% (without them: 2.9 ms where the real waited 11.0); and its input's
    gradient and loss, priced on stage 0's module without FSDP2's hooks, add to its busy time
    what the real rank 2's kernels add to rank 0's, within 1%."""
    modeled, real = tmp_path / "modeled", tmp_path / "real"
    proc = capture(modeled, "ppdp", 4, "gpipe", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "could not be priced" not in proc.stderr
    _real_pipeline(real, "gpipe", 4, "ppdp", "2")
    got, want = _bubbles(modeled), _bubbles(real)
    assert len(got) == len(want) == 4
    assert abs(sum(got[1:]) - sum(want[1:])) <= 0.15 * sum(want[1:]), (got, want)
    # the first: the fill, less the real rank 0's wait for its dp peer (a host late to the
    # step, as `_late_starts`), which a modeled job's copies never are
    want[0] -= _collective_waits(real, "all_gather")
    assert abs(got[0] - want[0]) <= 0.15 * want[0], (got, want)
    pipeline = json.loads((modeled / "manifest.json").read_text())["extra"]["model_ranks"][
        "pipeline"
    ]
    # the adding priced as rank 0's gradients stood before each backward: the real rank 0's
    # `add_`s (all of them its unsharded gradients'; its SGD adds with `_foreach_add_`)
    real_adds = _kernel_busy(real, 0, "aten::add_")
    assert pipeline["stage0_accumulate_ns"][0] == 0 and real_adds > 0
    assert sum(pipeline["stage0_accumulate_ns"]) == real_adds, (pipeline, real_adds)
    (copy,) = pipeline["copies"]
    added = copy["busy_ns"] - pipeline["stage0_busy_ns"]
    real_added = _kernel_busy(real, 2) - _kernel_busy(real, 0)  # stage 1's first rank
    assert real_added > 0 and abs(added - real_added) <= 0.01 * real_added, (copy, real_added)


@pytest.mark.sweep  # real ranks: ~4 s quiet (default suite < 15 min)
def test_a_schedule_of_several_stages_a_rank_stops_with_one_line_naming_why(tmp_path):
    proc = capture(tmp_path / "pp", "pp", 2, "interleaved")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    line = next(x for x in proc.stderr.splitlines() if "error:" in x)
    assert line.startswith("neuron-explorer: error: --model-ranks: ScheduleInterleaved1F1B")
    assert "torchrun" in line


@pytest.mark.sweep  # compiles a TP decode: ~10 s quiet (default suite < 15 min)
def test_a_compiled_tensor_parallel_decode_runs_its_all_reduces_inside_its_neff(tmp_path):
    """One graph a token, as transformers-neuronx compiles it: each layer's two all-reduces are
    groups of the NEFF on the collective cores, not eager collectives, and the static KV
    cache's update writes its new row only."""
    from neuron_explorer.backend.costmodel import get_spec
    from neuron_explorer.backend.costmodel.collectives import ALL_REDUCE, collective_cost
    from neuron_explorer.model import Profile

    proc = capture(tmp_path / "decode", "decode", 4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    db = Profile.open(tmp_path / "decode").duckdb()
    neff = db.execute(
        "SELECT max(op_name) FROM events WHERE kind = 'kernel' AND op_name LIKE 'neuron_graph_%'"
    ).fetchone()[0]
    kernels = db.execute(
        "SELECT name, dur_ns, bytes_written FROM events WHERE kind = 'kernel' AND op_name = ?"
        " ORDER BY start_ns", [neff]
    ).fetchall()  # fmt: skip
    all_reduces = [dur for name, dur, _w in kernels if name == "all_reduce"]
    assert all_reduces and len(all_reduces) % 4 == 0  # two layers, two a layer, each run
    expected = collective_cost(ALL_REDUCE, 256 * 2, 4, get_spec().collectives).transfer_ns
    assert set(all_reduces) == {expected}  # the hidden state's, among the 4 ranks
    # the cache row of one step: 2 of 8 heads (4 ranks) x 32 dims x bf16
    assert {w for n, _d, w in kernels if n == "index_copy"} == {2 * 32 * 2}
    eager = "SELECT count(*) FROM events WHERE kind = 'collective' AND name = 'all_reduce'"
    assert not db.execute(eager).fetchone()[0]  # (parallelize_module's scatters are eager)


MODEL_RANKS_WORKER = Path(__file__).resolve().parent / "ranks" / "model_ranks_worker.py"


def _collectives(profile_dir: Path) -> list[tuple]:
    from neuron_explorer.model import Profile

    rows = (
        Profile.open(profile_dir)
        .duckdb()
        .execute(
            "SELECT name, dur_ns, json_extract(args, '$.bytes')::BIGINT, "
            "json_extract(args, '$.world_size')::INT, json_extract_string(args, '$.algorithm'), "
            "json_extract_string(args, '$.link') FROM events "
            "WHERE kind = 'collective' ORDER BY start_ns"
        )
        .fetchall()
    )
    return [tuple(r) for r in rows]


@pytest.mark.sweep  # eight real ranks on two cores: minutes; with the other many-rank sweeps
@pytest.mark.timeout(900)
def test_model_ranks_prices_the_collectives_of_a_real_eight_rank_torchrun(tmp_path):
    """`capture --model-ranks 8` runs rank 0 alone; its DDP all-reduces cost what a real
    8-process torchrun's rank 0 measured (same bytes, group size, algorithm and transfer), and
    its manifest says rank 0 ran and ranks 1-7 are copies."""
    from test_distributed import torchrun

    schedule = ["--wait", "1", "--warmup", "0", "--active", "1"]
    modeled, real = tmp_path / "modeled", tmp_path / "real"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "neuron_explorer", "capture"]
    subprocess.run([*cli, "-o", str(modeled), "--model-ranks", "8", *schedule, "--", "python",
                    str(MODEL_RANKS_WORKER)], check=True, capture_output=True, env=env,
                   timeout=300)  # fmt: skip
    torchrun(MODEL_RANKS_WORKER, 8, str(real), timeout=600)
    got, want = _collectives(modeled), _collectives(real / "rank0")
    assert len(want) >= 2 and all(r[3] == 8 for r in want)  # DDP's buckets, over 8 ranks
    assert got == want
    extra = json.loads((modeled / "manifest.json").read_text())["extra"]
    assert extra["model_ranks"] == {"world_size": 8, "executed": [0], "copies": list(range(1, 8))}
    from neuron_explorer.analysis.summary import summarize
    from neuron_explorer.model import Profile

    assert summarize(Profile.open(modeled)).readiness.model_ranks == extra["model_ranks"]

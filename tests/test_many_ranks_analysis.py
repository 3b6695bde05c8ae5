"""The analysis of a many-rank profile costs what the same events in one rank cost (issue 31):
eight copies of a real NCCL trace as the ranks of one job give eight times one copy's graph,
each rank's replay and table row as one copy's, and the summary as it was."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import KINETO_GPU, SHARED_KINETO

from neuron_explorer.analysis.depgraph import build_graph
from neuron_explorer.analysis.replay import Change, replay
from neuron_explorer.analysis.summary import summarize
from neuron_explorer.analysis.windows import read_events, windows_of
from neuron_explorer.importers import import_traces
from neuron_explorer.model import Profile

RANKS = 8
# the per-rank table of the NCCL trace (its 3 steps), as the code computed it before the per-rank
# loops were grouped (commit e0d9cc5); every copy is the same rank
ONE_RANK_ROW = {
    "steps": 3, "median_step_ns": 222442191, "compute_ns": 115655847,
    "communication_ns": 39559468, "wait_ns": 46876493, "idle_ns": 509605325,
    "comm_overlap_ns": 7317025, "overlap": 0.1561,
}  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Profile, Profile]:
    """(the trace alone, its RANKS copies as the ranks of one job)."""
    tmp = tmp_path_factory.mktemp("ranks")
    src = KINETO_GPU / SHARED_KINETO["nccl"]
    doc = json.loads(gzip.decompress(src.read_bytes()))
    paths = []
    for rank in range(RANKS):
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": RANKS}
        paths.append(tmp / f"rank_{rank}.json")
        paths[-1].write_text(json.dumps(doc))
    one = Profile.open(import_traces([src], tmp / "one"))
    return one, Profile.open(import_traces(paths, tmp / "job"))


def _step_windows(profile: Profile, step: int) -> list:
    return [w for w in windows_of(profile) if w[1] == step]


def test_the_summary_of_the_job_is_each_rank_as_one_copy(job):
    one, many = job
    s1, s8 = summarize(one), summarize(many)
    assert s8.ranks_table is not None
    rows = [r.__dict__ for r in s8.ranks_table.rows]
    assert rows == [{"rank": r, **ONE_RANK_ROW} for r in range(RANKS)]
    assert s8.n_events == RANKS * s1.n_events
    assert s8.steps.num_rows == RANKS * s1.steps.num_rows
    assert [d.busy_ns for d in s8.devices] == [d.busy_ns for d in s1.devices] * RANKS


def test_a_steps_graph_reads_the_ranks_own_work_and_what_it_queues_behind(job):
    """Every rank's part of a step's graph is one copy's graph, and the graph reads of the other
    work on its queues only what started by its own work's last start there (what starts later
    is never looked at; reading it read every rank's whole trace for each step)."""
    one, many = job
    for step in sorted({w[1] for w in windows_of(one)}):
        g1, g8 = build_graph(one, step), build_graph(many, step)
        assert len(g8.nodes) == RANKS * len(g1.nodes)
        assert len(g8.edges) == RANKS * len(g1.edges)
        rows = len(read_events(many, _step_windows(many, step)))
        assert rows == RANKS * len(read_events(one, _step_windows(one, step)))
        for rank, win in g8.windows.items():
            assert win.foreign == g1.windows[0].foreign
            for track, (starts, _) in win.foreign.items():
                own = [n.start_ns for n in g8.nodes
                       if n.rank == rank and not n.host and n.track == track]  # fmt: skip
                assert starts and max(starts) <= max(own)


def test_host_time_removed_on_every_rank_replays_each_rank_as_one_copy(job):
    """A change removing host time on every rank of the job (one list of spans, as a rule names
    them) replays each rank's step as the same change replays one copy's."""
    one, many = job
    step = sorted({w[1] for w in windows_of(one)})[1]
    g1, g8 = build_graph(one, step), build_graph(many, step)
    win = g1.windows[0]
    cut = [(win.start_ns + k * 1_000_000, win.start_ns + k * 1_000_000 + 400_000)
           for k in range(0, (win.end_ns - win.start_ns) // 1_000_000, 3)]  # fmt: skip
    assert cut
    alone = replay(g1, Change("cut", drop_host=tuple((0, s, e) for s, e in cut))).step_ns[0]
    assert alone < replay(g1).step_ns[0]
    spans = tuple((r, s, e) for r in range(RANKS) for s, e in cut)
    assert replay(g8, Change("cut", drop_host=spans)).step_ns == dict.fromkeys(range(RANKS), alone)

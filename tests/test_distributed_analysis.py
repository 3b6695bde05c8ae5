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


@pytest.mark.slow
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

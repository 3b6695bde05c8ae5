"""Memory counters of a real capture sit on the one clock with the ops that allocated them."""

from __future__ import annotations

import numpy as np
import torch

import neuron_explorer
from neuron_explorer.model import Profile


def _capture_mlp(out) -> Profile:
    """A tiny MLP training on the neuron device, steps 1-2 recorded by trace_handler."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    x = torch.randn(512, 64).to("neuron")
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        record_shapes=True,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=2),
        on_trace_ready=neuron_explorer.trace_handler(out),
    ) as prof:
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return Profile.open(out)


def test_every_allocation_lands_inside_the_op_that_made_it(tmp_path):
    """Each memory sample that grew the device's memory (an op's output) lies inside a host
    op's span on the mapped clock: a sample taken inside a runtime call is placed inside that
    call's modeled span, not at its real offset (which runs past the op's end)."""
    prof = _capture_mlp(tmp_path / "mlp")
    con = prof.duckdb()
    # in the order written (the order the runtime recorded them): frees cut to one instant
    # share a timestamp, and ordering those by value would turn a run of frees into a growth
    samples = con.sql(
        "SELECT ts_ns, value FROM counters WHERE CAST(name AS VARCHAR) = 'memory_allocated'"
    ).fetchnumpy()
    samples["delta"] = np.diff(samples["value"], prepend=0.0)
    ops = con.sql(
        "SELECT start_ns, start_ns + dur_ns AS end_ns FROM events "
        "WHERE layer = 'host' AND kind = 'op'"
    ).fetchnumpy()
    ts, delta = samples["ts_ns"][1:], samples["delta"][1:]  # the first holds all before it
    grew = ts[delta > 0]
    assert len(grew) >= 8  # two steps of forward and backward outputs
    start, end = ops["start_ns"], ops["end_ns"]
    # at its end at the latest: what the op's return does (after the runtime's span, inside
    # torch's record of the op) is cut to an instant there (runtime/hostcost.py)
    inside = np.array([((start <= t) & (t <= end)).any() for t in grew])
    assert inside.all(), grew[~inside].tolist()
    # frees may come between ops (a Python reference dropped), never before the window began
    assert ts.min() >= 0 and (np.diff(samples["ts_ns"]) >= 0).all()

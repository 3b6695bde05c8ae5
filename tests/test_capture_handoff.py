"""Autograd's hand-offs to its device thread are not host time (backend/runtime/handoff.py).

On a loaded machine the scheduler can take milliseconds to wake autograd's device thread for
the first backward node, and the caller once the graph is done; in that time neither thread
runs. A real capture on the neuron device, with two backward hooks that sleep 30 ms where the
scheduler would (neither thread runs during a sleep either), shows whether the modeled host
clock keeps those waits: they must be cut, the real work around them kept.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch

import neuron_explorer
from neuron_explorer.model.profile import Profile

pytestmark = pytest.mark.slow
SLEEP_S = 0.03


def _wait() -> None:
    time.sleep(SLEEP_S)


def _capture(out, sleep: bool) -> Profile:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = model.to("neuron")
    x = torch.randn(8, 16).to("neuron")

    first = model[0].weight  # its gradient is accumulated last
    if sleep:
        # after the graph's last node, a final callback waits (queued after the runtime's own)
        first.register_post_accumulate_grad_hook(
            lambda p: torch.autograd.Variable._execution_engine.queue_callback(_wait)
        )

    def step() -> None:
        loss = model(x).sum()
        if sleep:  # the device thread waits before the first node's op
            loss.register_hook(lambda g: _wait())
        with torch.profiler.record_function("BWD"):
            loss.backward()
        model.zero_grad()

    step()
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    schedule=sched,
                                    on_trace_ready=neuron_explorer.trace_handler(out)) as prof:  # fmt: skip
            for _ in range(3):
                step()
                prof.step()
    return Profile.open(out)


def _backwards(profile: Profile) -> list[tuple[int, int, int]]:
    """Per recorded backward: its span on the modeled clock, the modeled time from the end
    of its last node to the caller's return, and its device kernels."""
    con = profile.duckdb()
    rows = con.execute(
        "SELECT start_ns, start_ns + dur_ns FROM events WHERE name = 'BWD' ORDER BY 1"
    ).fetchall()
    out = []
    for s, e in rows:
        last, kernels = con.execute(
            "SELECT max(start_ns + dur_ns) FILTER (WHERE layer = 'host' AND name LIKE "
            "'autograd::engine::evaluate_function:%'), count(*) FILTER (WHERE kind = 'kernel') "
            "FROM events WHERE start_ns BETWEEN ? AND ?", [s, e]
        ).fetchone()  # fmt: skip
        out.append((e - s, e - last, kernels))
    return out


def test_the_waits_for_autograds_device_thread_are_cut(tmp_path):
    slept = _backwards(_capture(tmp_path / "slept", sleep=True))
    plain = _backwards(_capture(tmp_path / "plain", sleep=False))
    assert len(slept) == len(plain) == 2
    for (dur, tail, kernels), (_, _, plain_kernels) in zip(slept, plain, strict=True):
        # 60 ms of waits: with them kept the backward would last over 60 ms
        assert dur < 25_000_000, f"backward {dur / 1e6:.1f} ms on the modeled clock"
        assert tail < 5_000_000, f"{tail / 1e6:.1f} ms from the graph's end to the return"
        assert kernels == plain_kernels > 0  # the work itself is all there

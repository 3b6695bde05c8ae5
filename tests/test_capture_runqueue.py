"""The simulating machine's preemptions are not host time (backend/runtime/guard.cpp, record.py).

On a machine with fewer cores than busy processes (4 torchrun ranks on 2 cores), a thread spends
milliseconds runnable but not running, and a host of its own would not. With the C++ guard each
thread's run-queue delay (Linux's /proc/thread-self/schedstat) between an op's return and the
next op's entry is cut from the modeled host clock. A real capture with a busy process pinned to
the same CPU as the recording thread shows whether it is: the loop's modeled span must fit in
what the loop took less the delay the thread measured itself, and the manifest says how much was
cut, never more than the thread waited.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

import pytest
import torch

import neuron_explorer
from neuron_explorer import backend
from neuron_explorer.model.profile import Profile

SCHEDSTAT = "/proc/thread-self/schedstat"
pytestmark = [
    pytest.mark.skipif(
        backend.runtime.guard.kind != "native",
        reason="the run-queue delay is read by the C++ guard",
    ),  # fmt: skip
    pytest.mark.skipif(not os.access(SCHEDSTAT, os.R_OK), reason=f"no {SCHEDSTAT} (not Linux)"),
]
OPS = 30


def _schedstat() -> tuple[int, int]:
    """(ns this thread ran, ns it waited on a run queue)."""
    with open(SCHEDSTAT) as f:
        ran, waited, _ = f.read().split()
    return int(ran), int(waited)


def _python_work() -> int:
    """About half a millisecond of the user's own code between two ops: kept on the clock."""
    total = 0
    for i in range(20_000):
        total += i
    return total


def test_a_preempted_threads_run_queue_delay_is_cut_and_recorded(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    affinity = os.sched_getaffinity(0)
    x = torch.randn(16, device="neuron")
    busy = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})"
                             "\nwhile True: pass"])  # fmt: skip
    os.sched_setaffinity(0, {cpu})  # this thread only: it shares one CPU with the busy loop
    gc.disable()  # an op after a collection cuts no delay (the pause is cut, by itself)
    try:
        time.sleep(0.2)  # the busy process is running
        _, waited0 = _schedstat()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    on_trace_ready=neuron_explorer.trace_handler(tmp_path / "p")):  # fmt: skip
            x = x + 1  # the op before the loop: the loop's first gap has a return to start from
            _, waited_a = _schedstat()
            t_a = time.time_ns()
            with torch.profiler.record_function("loop"):
                for _ in range(OPS):
                    x = x + 1
                    _python_work()
                x = x + 1  # the last gap ends at an op too
            t_b = time.time_ns()
            _, waited_b = _schedstat()
        _, waited1 = _schedstat()
    finally:
        gc.enable()
        os.sched_setaffinity(0, affinity)
        busy.kill()
        busy.wait()
    p = Profile.open(tmp_path / "p")
    run_queue = p.manifest.extra["run_queue"]
    assert run_queue["source"] == SCHEDSTAT
    con = p.duckdb()
    ((loop_ns,),) = con.execute("SELECT dur_ns FROM events WHERE name = 'loop'").fetchall()
    ((modeled_ns,),) = con.execute(
        "SELECT coalesce(sum(e.dur_ns), 0) FROM events e, events l WHERE l.name = 'loop' AND "
        "e.layer = 'host' AND e.kind = 'runtime' AND e.start_ns >= l.start_ns AND "
        "e.start_ns + e.dur_ns <= l.start_ns + l.dur_ns"
    ).fetchall()
    waited = waited_b - waited_a
    assert waited > 0, "the busy process never took the CPU"  # both runnable on one CPU
    # what was cut is run-queue delay this thread had (one thread records here), never more
    assert 0 < run_queue["cut_ns"] <= waited1 - waited0, (run_queue, waited1 - waited0)
    # the loop on the modeled clock: its real time less the delay, each op's modeled cost in
    # place of its real span, 0.1 ms for the clock readings of the test itself. What is left
    # of the real time once the delay is taken does not depend on the busy process (a stall
    # of the virtual machine's CPU, not seen by Linux's scheduler, stays in both)
    assert loop_ns <= (t_b - t_a) - waited + modeled_ns + 100_000, (
        loop_ns,
        t_b - t_a,
        waited,
        run_queue,
    )

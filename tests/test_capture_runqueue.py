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


def _loop(out, busy: bool) -> tuple[int, dict, int]:
    """Capture OPS ops with the user's code between them, on one CPU shared with a busy process
    or not: (the loop's modeled span, the manifest's run_queue, ns this thread waited on a run
    queue during the capture)."""
    cpu = min(os.sched_getaffinity(0))
    affinity = os.sched_getaffinity(0)
    x = torch.randn(16, device="neuron")
    hog = None
    if busy:
        hog = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, "
                                f"{{{cpu}}})\nwhile True: pass"])  # fmt: skip
    os.sched_setaffinity(0, {cpu})  # this thread only: it shares one CPU with the busy loop
    gc.disable()  # an op after a collection cuts no delay (the pause is cut, by itself)
    try:
        time.sleep(0.2)  # the busy process is running
        _, waited0 = _schedstat()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    on_trace_ready=neuron_explorer.trace_handler(out)):  # fmt: skip
            x = x + 1  # the op before the loop: the loop's first gap has a return to start from
            with torch.profiler.record_function("loop"):
                for _ in range(OPS):
                    x = x + 1
                    _python_work()
                x = x + 1  # the last gap ends at an op too
        _, waited1 = _schedstat()
    finally:
        gc.enable()
        os.sched_setaffinity(0, affinity)
        if hog is not None:
            hog.kill()
            hog.wait()
    p = Profile.open(out)
    ((loop_ns,),) = p.duckdb().execute("SELECT dur_ns FROM events WHERE name = 'loop'").fetchall()
    return loop_ns, p.manifest.extra["run_queue"], waited1 - waited0


def test_a_preempted_threads_run_queue_delay_is_cut_and_recorded(tmp_path):
    alone, _, _ = _loop(tmp_path / "alone", busy=False)
    shared, run_queue, waited = _loop(tmp_path / "shared", busy=True)
    assert run_queue["source"] == SCHEDSTAT
    # the busy process took the CPU (both runnable on one CPU: the thread waited), and what was
    # cut is run-queue delay the thread had (one thread records here), never more
    assert 0 < run_queue["cut_ns"] <= waited, (run_queue, waited)
    # On the modeled clock the loop takes what it takes with the CPU to itself: the delay is
    # cut, the user's code kept. Compared with the same loop alone, not with real time less the
    # delay: on this virtual machine the scheduler's clock and the wall clock part by up to a
    # third of the delay, and the host's stalls of the machine's CPU show in neither. Left on
    # the clock, the shared CPU made the loop 2-7x as long.
    assert shared <= 1.5 * alone + 1_000_000, (shared, alone, run_queue, waited)

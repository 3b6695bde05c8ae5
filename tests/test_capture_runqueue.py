"""The simulating machine's preemptions are not host time (backend/runtime/guard.cpp, record.py).

On a machine with fewer cores than busy processes (4 torchrun ranks on 2 cores), a thread spends
milliseconds runnable but not running, and a host of its own would not; on a virtual machine its
CPU is also stalled by the host, which Linux inside does not see as run-queue delay. With the C++
guard, between an op's return and the next op's entry, a thread that did not block keeps its CPU
time on the modeled host clock (the rest is cut), and one that blocked (a data loader's sleep)
keeps the real time less its run-queue delay (Linux's /proc/thread-self/schedstat). A real
capture with a busy process pinned to the same CPU as the recording thread shows whether the
first holds: the loop's modeled span must fit in what the loop takes alone, and the manifest says
how much was cut, never more than the time the thread spent off its CPU; a capture with a sleep
between two ops shows that the second holds.
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


def _python_work() -> int:
    """About half a millisecond of the user's own code between two ops: kept on the clock."""
    total = 0
    for i in range(20_000):
        total += i
    return total


def _loop(out, busy: bool) -> tuple[int, dict, int]:
    """Capture OPS ops with the user's code between them, on one CPU shared with a busy process
    or not: (the loop's modeled span, the manifest's run_queue, ns this thread spent off its CPU
    during the capture: the real time less its CPU time, run-queue delay and stalls alike)."""
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
        off0 = time.time_ns() - time.thread_time_ns()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    on_trace_ready=neuron_explorer.trace_handler(out)):  # fmt: skip
            x = x + 1  # the op before the loop: the loop's first gap has a return to start from
            with torch.profiler.record_function("loop"):
                for _ in range(OPS):
                    x = x + 1
                    _python_work()
                x = x + 1  # the last gap ends at an op too
        off1 = time.time_ns() - time.thread_time_ns()
    finally:
        gc.enable()
        os.sched_setaffinity(0, affinity)
        if hog is not None:
            hog.kill()
            hog.wait()
    p = Profile.open(out)
    ((loop_ns,),) = p.duckdb().execute("SELECT dur_ns FROM events WHERE name = 'loop'").fetchall()
    return loop_ns, p.manifest.extra["run_queue"], off1 - off0


def test_a_preempted_threads_run_queue_delay_is_cut_and_recorded(tmp_path):
    alone, _, _ = _loop(tmp_path / "alone", busy=False)
    shared, run_queue, off = _loop(tmp_path / "shared", busy=True)
    assert run_queue["source"] == SCHEDSTAT
    # the busy process took the CPU (both runnable on one CPU: the thread waited), and what was
    # cut is time the thread spent off its CPU (one thread records here), never more
    assert 0 < run_queue["cut_ns"] <= off, (run_queue, off)
    # On the modeled clock the loop takes what it takes with the CPU to itself: the delay is
    # cut, the user's code kept. Compared with the same loop alone, not with real time less the
    # delay: on this virtual machine the host's stalls of the machine's CPU lengthen the loop
    # alone too. Left on the clock, the shared CPU made the loop 2-7x as long.
    assert shared <= 1.5 * alone + 1_000_000, (shared, alone, run_queue, off)


def test_a_sleep_between_two_ops_stays_on_the_host_clock(tmp_path):
    """A data loader's wait between steps (here a 5 ms sleep) blocks the thread: the thread's CPU
    time over it is next to nothing, but the time is the program's, and the modeled gap between
    the ops around it keeps at least the 5 ms (only run-queue delay is cut where a thread
    blocked, and a sleeping thread is on no run queue)."""
    out = tmp_path / "sleep"
    x = torch.randn(16, device="neuron")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                on_trace_ready=neuron_explorer.trace_handler(out)):  # fmt: skip
        x = x + 1
        for _ in range(3):
            x = x * 2
            with torch.profiler.record_function("loader"):
                time.sleep(0.005)
            x = x - 1
    p = Profile.open(out)
    rows = (
        p.duckdb()
        .execute(
            "SELECT name, start_ns, dur_ns FROM events WHERE layer = 'host' AND name IN "
            "('aten::mul', 'aten::sub', 'loader') ORDER BY start_ns"
        )
        .fetchall()
    )
    assert [r[0] for r in rows] == ["aten::mul", "loader", "aten::sub"] * 3, rows
    for mul, loader, sub in zip(rows[::3], rows[1::3], rows[2::3], strict=True):
        gap = sub[1] - (mul[1] + mul[2])
        assert gap >= 5_000_000, (mul, loader, sub)

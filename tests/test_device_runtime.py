"""The runtime's bookkeeping on real runs: compile counters after resets, fallback warnings at
the user's line, and what a run that dies inside an op leaves in its profile (issue 11)."""

from __future__ import annotations

import inspect
import os
import time
import warnings

import pytest
import torch

import neuron_explorer.backend as backend


def _compiled_linear_twice(model):
    f = torch.compile(model, backend="neuron", dynamic=False)
    f(torch.randn(2, 4, device="neuron"))
    f(torch.randn(3, 4, device="neuron"))  # a new batch size: a recompile


@pytest.mark.slow  # torch.compile: ~9 s
def test_recompile_counted_after_dynamo_reset_and_stats_reset():
    model = torch.nn.Linear(4, 4).to("neuron")
    torch._dynamo.reset()
    backend.reset_compile_stats()
    _compiled_linear_twice(model)
    first = backend.compile_stats()
    assert (first.graph_compiles, first.graph_recompiles) == (2, 1)
    torch._dynamo.reset()
    backend.reset_compile_stats()
    assert backend.compile_stats().graph_recompiles == 0
    _compiled_linear_twice(model)  # the same graph and shapes as before the reset
    again = backend.compile_stats()
    assert (again.graph_compiles, again.graph_recompiles) == (2, 1)


def test_backward_fallback_warning_points_at_the_users_backward_line():
    from neuron_explorer.backend.runtime import tracking

    tracking._warned.difference_update({"aten::i0", "aten::special_i1"})  # once per process
    x = torch.randn(4, device="neuron", requires_grad=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = torch.special.i0(x).sum()
        forward_line = inspect.currentframe().f_lineno - 1
        y.backward()
        backward_line = inspect.currentframe().f_lineno - 1
    by_op = {str(w.message).split()[1]: w for w in seen if "not supported" in str(w.message)}
    assert (by_op["aten::i0"].filename, by_op["aten::i0"].lineno) == (__file__, forward_line)
    bwd = by_op["aten::special_i1"]  # i0's backward runs i1, on autograd's device thread
    assert (bwd.filename, bwd.lineno) == (__file__, backward_line)
    assert "backward of I0Backward0" in str(bwd.message)
    assert torch.equal(x.grad.cpu(), torch.special.i1(x.detach().cpu()))


def test_whole_ops_cover_every_decomposed_op_with_a_cpu_kernel():
    from neuron_explorer.backend.runtime import whole_ops

    # torch 2.13's list; a torch upgrade that adds one makes this fail until it is added
    assert whole_ops.decomposed_with_cpu_kernel() == sorted(whole_ops.WHOLE_OPS)


@pytest.mark.parametrize("act", [torch.nn.functional.silu, torch.nn.functional.mish])
@pytest.mark.parametrize("n", [7, 1000, 4097])
def test_silu_and_mish_gradients_bitwise_equal_to_cpu(act, n):
    torch.manual_seed(n)
    x = torch.randn(n, requires_grad=True)
    dev = x.detach().to("neuron").requires_grad_()
    g = torch.randn(n)
    act(x).backward(g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mish_backward may be a CPU fallback: same numbers
        act(dev).backward(g.to("neuron"))
    assert torch.equal(x.grad, dev.grad.cpu())
    (gx,) = torch.autograd.grad(act(x).sum(), x, create_graph=True)  # double backward too
    (gd,) = torch.autograd.grad(act(dev).sum(), dev, create_graph=True)
    assert torch.equal(
        torch.autograd.grad(gx.sum(), x)[0], torch.autograd.grad(gd.sum(), dev)[0].cpu()
    )


DIES_IN_AN_OP = """
import torch
model = torch.nn.Linear(8, 4).to("neuron")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    x = torch.randn(16, 8, device="neuron")
    model(x).sum().backward(); opt.step(); opt.zero_grad()
    if step == 3:  # inside the recorded steps (wait 1, warmup 1, active 3)
        y = x @ torch.randn(5, 3, device="neuron")  # line 9: the shapes do not match
"""


@pytest.mark.slow  # a captured run in a subprocess: ~6 s
def test_a_run_that_dies_in_an_op_says_so_in_its_profile_and_summary(tmp_path, capsys, monkeypatch):
    import json
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(DIES_IN_AN_OP)
    run = [sys.executable, "-m", "neuron_explorer"]
    done = subprocess.run([*run, "capture", "-o", str(tmp_path / "p"), "--", "python", str(script)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1 and "cannot be multiplied" in done.stderr
    ended = json.loads((tmp_path / "p" / "manifest.json").read_text())["extra"]["run_ended"]
    assert isinstance(ended["unix_ns"], int)  # when it ended: which rank of a job failed first
    assert {k: v for k, v in ended.items() if k != "unix_ns"} == {
        "exception": "RuntimeError",
        "message": "mat1 and mat2 shapes cannot be multiplied (16x8 and 5x3)",
        "op": "aten::mm",
        "file": str(script),
        "line": 9,
        "function": "<module>",
    }
    from neuron_explorer.cli import main

    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "400")  # one line per message: rich wraps at the width
    assert main(["summary", str(tmp_path / "p")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "Run ended early by RuntimeError: mat1 and mat2 shapes cannot be multiplied (16x8 and "
        f"5x3) in aten::mm at {script}:9"
    ) in text
    assert main(["summary", "--json", str(tmp_path / "p")]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["run_ended"]["op"] == "aten::mm"
    # analyze, what a new user runs first, says it too, in its text and its JSON
    assert main(["analyze", str(tmp_path / "p")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Run ended early by RuntimeError: mat1 and mat2 shapes cannot be multiplied" in text
    assert main(["analyze", "--json", str(tmp_path / "p")]) == 0
    assert json.loads(capsys.readouterr().out)["run_ended"] == ended


def test_own_profiler_block_ending_in_an_exception_records_it(tmp_path):
    import neuron_explorer

    model = torch.nn.Linear(8, 4).to("neuron")
    sched = torch.profiler.schedule(wait=0, warmup=1, active=3)
    with pytest.raises(IndexError):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                    on_trace_ready=neuron_explorer.trace_handler(tmp_path / "p")) as prof:  # fmt: skip
            for step in range(5):
                loss = model(torch.randn(16, 8, device="neuron")).sum()
                if step == 2:
                    line = inspect.currentframe().f_lineno + 1
                    loss.reshape(1).expand(3)[5]
                loss.backward()
                prof.step()
    from neuron_explorer.model.profile import Profile

    ended = Profile.open(tmp_path / "p").manifest.extra["run_ended"]
    assert (ended["exception"], ended["file"], ended["line"]) == ("IndexError", __file__, line)
    assert "out of bounds" in ended["message"]


def test_indexing_with_a_cpu_index_tensor_trains_as_on_the_cpu():
    # op_db's __getitem__ and index_put samples: CPU indices are allowed, as on CUDA, in the
    # forward (aten::index) and in its backward (aten::index_put)
    idx = torch.tensor([1, 3, 3])
    x = torch.randn(5, requires_grad=True)
    dev = x.detach().to("neuron").requires_grad_()
    (x[idx] * 2).sum().backward()
    (dev[idx] * 2).sum().backward()
    assert torch.equal(x.grad, dev.grad.cpu())
    out = torch.index_put(torch.zeros(5, device="neuron"), (idx,), torch.ones(3, device="neuron"))
    assert torch.equal(out.cpu(), torch.index_put(torch.zeros(5), (idx,), torch.ones(3)))


@pytest.fixture
def calibrated(monkeypatch):
    """This thread takes the Python guard's path (no C++ guard: no exact round trip), the one
    hostcost.thread_slots() gives where g++ is missing: the calibrated round trip."""
    from neuron_explorer.backend.runtime import events, hostcost

    monkeypatch.setattr(hostcost.THREAD, "rt", None, raising=False)
    # the recorded path reads the slots from its per-thread state (record._thread_state)
    monkeypatch.setattr(events._thread, "state", [events.native_tid(), -1, None], raising=False)
    monkeypatch.setattr(hostcost, "EXACT", False)


def test_metadata_ops_and_the_wrappers_round_trip_are_cut_from_the_host_clock(calibrated):
    from neuron_explorer.backend.runtime import events, hostcost
    from neuron_explorer.capture.clock import Call, HostClock

    x = torch.randn(4, 4, device="neuron")
    events.clear()
    hostcost.GAPS.clear()  # no refit inside the loop: each op cuts the same round trip
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        t_start = time.time_ns()
        for _ in range(20):
            x.view(-1)
        t_end = time.time_ns()
        drained = events.drain()
    cuts = [e for e in drained if e.kind == "cut" and e.name == "aten::view"]
    o = hostcost.OUTSIDE_NS
    assert o is not None and o > 0
    # the span costs nothing, and the wrapper's round trip before the next op is cut too: the
    # running cut grows by each span plus o, or the real gap between the two if less
    assert len(cuts) == 20 and all(e.host_cost_ns == 0 for e in cuts)
    for a, b in zip(cuts, cuts[1:], strict=False):
        gap = b.host_start_ns - a.host_end_ns
        assert b.cut_before_ns - a.cut_before_ns == (a.host_end_ns - a.host_start_ns) + min(o, gap)
    calls = [Call(e.host_start_ns, e.host_end_ns, e.host_cost_ns, e.cut_before_ns) for e in cuts]
    clock = HostClock(calls)
    real = t_end - t_start
    modeled = int(clock.map([t_end])[0] - clock.map([t_start])[0])
    # every view's span and round trip is gone from the modeled time of the loop
    spans = sum(e.host_end_ns - e.host_start_ns for e in cuts)
    trips = sum(
        min(o, b.host_start_ns - a.host_end_ns) for a, b in zip(cuts, cuts[1:], strict=False)
    )
    assert 0 <= modeled <= real - spans - trips


def test_an_op_that_records_grad_cuts_the_round_trip_measured_with_grad(calibrated):
    from neuron_explorer.backend.runtime import events, hostcost
    from neuron_explorer.capture.clock import Call, HostClock

    w = torch.randn(4, 4).to("neuron").requires_grad_()
    x = torch.randn(4, 4, device="neuron")
    events.clear()
    hostcost.GAPS.clear()  # no refit inside the loop
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        x.view(-1)  # the first recorded op calibrates, if no earlier test did
        events.clear()
        t_start = time.time_ns()
        for _ in range(20):
            w.view(-1)
        t_end = time.time_ns()
        with torch.no_grad():
            w.view(-1)  # records no grad: the plain round trip
        x.view(-1)
        drained = events.drain()
    o, og = hostcost.OUTSIDE_NS, hostcost.OUTSIDE_GRAD_NS
    assert o is not None and og >= o > 0
    cuts = [e for e in drained if e.kind == "cut" and e.name == "aten::view"]
    assert len(cuts) == 22 and all(e.host_cost_ns == 0 for e in cuts)
    # the running cut grows by each span plus the round trip of the next op (at most the gap)
    pairs = list(zip(cuts, cuts[1:], strict=False))
    grown = [
        b.cut_before_ns - a.cut_before_ns - (a.host_end_ns - a.host_start_ns) for a, b in pairs
    ]
    gaps = [b.host_start_ns - a.host_end_ns for a, b in pairs]
    assert grown == [min(r, g) for r, g in zip([og] * 19 + [o, o], gaps, strict=True)]
    grad_cuts = cuts[:20]
    clock = HostClock(
        [Call(e.host_start_ns, e.host_end_ns, e.host_cost_ns, e.cut_before_ns) for e in grad_cuts]
    )
    modeled = int(clock.map([t_end])[0] - clock.map([t_start])[0])
    spans = sum(e.host_end_ns - e.host_start_ns for e in grad_cuts)
    # the clock takes each round trip from the gap before its op, all of what the runtime cut
    assert 0 <= modeled <= (t_end - t_start) - spans - sum(grown[:19])


def test_the_round_trip_is_refit_from_the_gaps_of_the_ops_recorded(monkeypatch, calibrated):
    # the loop's calibration is a floor; every BATCH ops that record no grad, the figure is
    # raised to the low percentile of their real gaps since the last call, less the CPU's view
    from neuron_explorer.backend.runtime import events, hostcost

    x = torch.randn(8, 8, device="neuron")
    w = torch.randn(8, 8).to("neuron").requires_grad_()
    monkeypatch.setattr(hostcost, "BATCH", 40)
    events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        x.view(-1)  # calibrates, if no earlier test did
        x + 1  # compiled here: a compile's real time is not in its drained event's span
        hostcost.GAPS.clear()
        events.clear()
        w.t()  # records grad: not sampled
        for i in range(39):
            (x + 1) if i % 3 == 0 else x.view(-1)  # launches and metadata ops alike
        before = list(hostcost.GAPS)
        o0, og0 = hostcost.OUTSIDE_NS, hostcost.OUTSIDE_GRAD_NS
        x.t()  # the 40th sample: refit
        x.view(-1)
        drained = events.drain()
    calls = [e for e in drained if e.kind in ("cut", "runtime")]
    assert calls[0].name == "aten::t" and len(calls) == 42
    assert len(before) == 39 and len(hostcost.GAPS) == 1
    # the samples are the real gaps between the recorded calls (the first is against the grad
    # op before it, which takes no sample)
    real = [b.host_start_ns - a.host_end_ns for a, b in zip(calls, calls[1:], strict=False)]
    assert before == real[:39]
    gaps40 = sorted([*before, real[39]])
    fit = max(hostcost.LOOP_NS, gaps40[len(gaps40) * hostcost.PERCENTILE // 100] - hostcost.CPU_NS)
    assert hostcost.OUTSIDE_NS == fit >= hostcost.LOOP_NS > 0
    assert hostcost.OUTSIDE_GRAD_NS - hostcost.OUTSIDE_NS == og0 - o0  # autograd's extra kept
    # the op after the refit cuts the new figure (or its gap, if less)
    last, prev = calls[-1], calls[-2]
    grown = last.cut_before_ns - prev.cut_before_ns - (prev.host_end_ns - prev.host_start_ns)
    assert grown == min(fit, last.host_start_ns - prev.host_end_ns)


def test_an_in_place_op_cuts_at_most_the_loops_round_trip(monkeypatch, calibrated):
    # it returns its input's wrapper, no new one: GPT-2's add_ spends 7 us outside its span
    # where a view spends 18, so a refit figure (raised from the gaps) does not apply to it
    from neuron_explorer.backend.runtime import events, hostcost

    x = torch.randn(8, 8, device="neuron")
    events.clear()
    hostcost.GAPS.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        x.view(-1)  # calibrates, if no earlier test did
        monkeypatch.setattr(hostcost, "OUTSIDE_NS", 4 * hostcost.LOOP_NS)  # as a refit can
        events.clear()
        x.add(1)  # compiled here, so the loop below only launches
        x.add_(1)
        for _ in range(4):
            x.add(1)
            x.add_(1)
        drained = events.drain()
    calls = [e for e in drained if e.kind == "runtime"][2:]
    assert [c.op_name for c in calls] == ["aten::add", "aten::add_"] * 4
    for a, b in zip(calls, calls[1:], strict=False):
        own = (a.host_end_ns - a.host_start_ns) - a.host_cost_ns
        grown = b.cut_before_ns - a.cut_before_ns - own
        bound = hostcost.LOOP_NS if b.op_name == "aten::add_" else hostcost.OUTSIDE_NS
        assert grown == min(bound, b.host_start_ns - a.host_end_ns)


def test_the_round_trip_calibration_leaves_no_event_in_the_profile(tmp_path, calibrated):
    # it runs under the recording profiler, record functions on (what every recorded op pays),
    # inside the first recorded op: a view here, whose cut drops what torch recorded in it
    import neuron_explorer
    from neuron_explorer.backend.runtime import hostcost
    from neuron_explorer.model.profile import Profile

    x = torch.randn(4, 4, device="neuron")
    w = torch.randn(4, 4).to("neuron").requires_grad_()
    hostcost.OUTSIDE_NS = None  # calibrate again, inside this capture's first recorded op
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=sched,
        on_trace_ready=neuron_explorer.trace_handler(tmp_path / "p"),
    ) as prof:
        for _ in range(2):  # a warm-up step (nothing recorded), then the active one
            for _ in range(3):
                x.view(-1)
            (w.view(-1) * 2).sum()
            prof.step()
    assert hostcost.OUTSIDE_NS is not None and hostcost.OUTSIDE_GRAD_NS >= hostcost.OUTSIDE_NS
    con = Profile.open(tmp_path / "p").duckdb()
    views = con.execute("SELECT count(*) FROM events WHERE name = 'aten::view'").fetchone()[0]
    assert views == 4  # the user's four, none of the calibration's 2 x 7 x 40 x 2


needs_native_guard = pytest.mark.skipif(
    backend.runtime.guard.kind != "native", reason="the exact round trip needs the C++ guard"
)


def _exact_capture(path):
    """A capture of views, in-place ops, a linear (CompositeImplicit: t and addmm) with its
    backward on autograd's device thread, and a factory: 12 of each, after a warm-up step."""
    import neuron_explorer

    x = torch.randn(8, 8, device="neuron")
    w = torch.randn(8, 8).to("neuron").requires_grad_()
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=sched,
        on_trace_ready=neuron_explorer.trace_handler(path),
    ) as prof:
        for _ in range(2):
            for _ in range(12):
                x.view(-1)
                x.mul_(1.0)  # in place (not add_: the grad's accumulation is one too)
                torch.nn.functional.linear(x, w).sum().backward()
                torch.empty(4, device="neuron")
            x.add(1)  # the last op's return is cut at the next op: one more after the loop
            prof.step()


@needs_native_guard
def test_each_op_keeps_its_documented_host_cost_and_its_round_trip_is_cut_exactly(tmp_path):
    # the runtime's span starts where torch's record of the op starts (the C++ record callback:
    # autograd, the boxing, the call into Python inside it) and the op's return up to the
    # record's end is cut at the next op: torch's own event of each op, on the modeled host
    # clock, keeps the documented cost (launch_ns, metadata_ns), whatever the load
    from neuron_explorer.backend.runtime import hostcost, model
    from neuron_explorer.model.profile import Profile

    _exact_capture(tmp_path / "p")
    assert hostcost.EXACT and not hostcost.ON  # the callback is off once the capture drained
    rt = model.spec().runtime
    want = {"aten::view": rt.metadata_ns, "aten::t": rt.metadata_ns,
            "aten::empty": rt.metadata_ns, "aten::mul_": rt.launch_ns,
            "aten::mm": rt.launch_ns, "aten::sum": rt.launch_ns}  # fmt: skip
    con = Profile.open(tmp_path / "p").duckdb()
    rows = con.execute(
        "SELECT name, count(*), median(dur_ns) FROM events WHERE layer = 'host' AND kind = 'op' "
        "GROUP BY name"
    ).fetchall()
    got = {name: (n, dur) for name, n, dur in rows if name in want}
    assert set(got) == set(want)
    for name, cost in want.items():
        n, dur = got[name]
        # mm: the forward's addmm is an addmm; the backward's two mm run on the device thread
        assert n >= 12, name
        # the only real time left: torch's profiler callback around ours (under a microsecond)
        assert cost * 0.8 <= dur <= cost + 1_500, (name, dur)


def test_the_host_costs_are_measured_on_this_host_and_written_in_the_profile(tmp_path):
    # launch, metadata and free costs are the plain CPU's own on this host (runtime/hostcal.py),
    # what the profile's manifest records; NEURON_HOST_COSTS=spec keeps the spec's figures
    import subprocess
    import sys

    from neuron_explorer.backend.costmodel import get_spec
    from neuron_explorer.backend.runtime import model
    from neuron_explorer.model.profile import Profile

    _exact_capture(tmp_path / "p")
    rt, documented = model.spec().runtime, get_spec().runtime
    spec = Profile.open(tmp_path / "p").manifest.device_spec
    sources = spec["sources"]
    for name in ("launch_ns", "metadata_ns", "free_ns"):
        assert spec["runtime"][name] == getattr(rt, name)
        assert sources[f"runtime.{name}"].startswith("MEASURED on this host"), name
    assert rt.launch_ns != documented.launch_ns or rt.metadata_ns != documented.metadata_ns
    assert 0 < rt.free_ns < rt.launch_ns  # dropping a small tensor costs less than a dispatch
    assert spec["runtime"]["sync_ns"] == documented.sync_ns  # the device's own figures stay
    assert sources["runtime.sync_ns"].startswith("ASSUMPTION")
    # the probes are plain CPU ops that a recording profiler never sees, even under a mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    from neuron_explorer.backend.runtime import hostcal

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with FakeTensorMode():
            again = hostcal.measure()
    assert not [e.name for e in prof.events() if e.name.startswith("aten::")]
    assert all(isinstance(v, int) and v > 0 for v in again.values()), again
    code = (
        "import torch, neuron_explorer.backend\n"
        "from neuron_explorer.backend.costmodel import get_spec\n"
        "from neuron_explorer.backend.runtime import model\n"
        "assert model.spec() == get_spec(), model.spec().runtime\n"
        "print(model.spec().runtime.launch_ns, model.spec().runtime.metadata_ns)\n"
    )
    env = {**os.environ, "NEURON_HOST_COSTS": "spec"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(documented.launch_ns), str(documented.metadata_ns)]


@needs_native_guard
def test_the_wrappers_frees_between_ops_keep_only_the_modeled_free(tmp_path):
    # a wrapper's free (the subclass instance, its payload, the memory accounting's weak
    # reference: several microseconds) is simulator time where a real device's tensor costs
    # the CPU's free: between two ops, 2,000 frees keep free_ns each on the modeled host clock
    import ctypes

    import neuron_explorer
    from neuron_explorer.backend.runtime import hostcost, model
    from neuron_explorer.model.profile import Profile

    assert hostcost.FREES
    n, free_ns = 2000, model.spec().runtime.free_ns
    x = torch.randn(16, device="neuron")
    kept: list = []
    sched = torch.profiler.schedule(wait=0, warmup=1, active=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=neuron_explorer.trace_handler(tmp_path / "p")) as prof:  # fmt: skip
        for _ in range(2):
            xs = [x + 1 for _ in range(n)]  # each its own storage
            kept.append(x.mul(2))
            slots = (ctypes.c_int64 * hostcost.SLOTS).from_address(
                hostcost.NATIVE.neuron_round_trip_slot()  # type: ignore[union-attr]
            )
            queued0 = hostcost.QUEUED_NS[0]
            t0, cut0 = time.time_ns(), slots[hostcost.FREE]
            xs.clear()
            real, cut = time.time_ns() - t0, slots[hostcost.FREE] - cut0
            kept.append(x.mul(3))
            queued = hostcost.QUEUED_NS[0] - queued0  # cut by mul(3): preemptions since mul(2)
            prof.step()
    con = Profile.open(tmp_path / "p").duckdb()
    (a_end, b_start), *_ = con.execute(
        "SELECT lag(start_ns + dur_ns) OVER (ORDER BY start_ns), start_ns FROM events "
        "WHERE layer = 'host' AND kind = 'op' AND name = 'aten::mul' QUALIFY lag(start_ns) "
        "OVER (ORDER BY start_ns) IS NOT NULL"
    ).fetchall()
    gap = b_start - a_end
    assert real > 2 * n * free_ns  # the wrapper's frees: 2.4-5 us each here
    # each free keeps the modeled free; what the frees took beyond it is cut, and so is the
    # thread's run-queue delay (a loaded machine's preemptions, in a free or between two:
    # guard.cpp); the list's own loop and the clock readings stay real
    assert cut + queued > 0.5 * real, (real, cut, queued)  # most of the clear, cut
    assert 0.9 * n * free_ns <= gap <= n * free_ns + 0.25 * real, (gap, real, cut, queued)


@needs_native_guard
def test_timed_frees_leave_class_assignment_and_subclasses_working():
    # the frees are timed from the wrapper type's tp_finalize to the end of torch's base
    # type's tp_dealloc: the slots CPython compares when a tensor's __class__ is assigned
    # (Module.to swaps a CPU Parameter with a neuron tensor) stay as they were, and a subclass
    # of the wrapper is freed once, its type's references kept
    import sys
    import weakref

    from neuron_explorer.backend.tensor import NeuronTensor

    class Sub(NeuronTensor):
        pass

    refs = sys.getrefcount(Sub)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        torch.ones(2, device="neuron").add(1)  # a recorded op: frees are timed from here
        lin = torch.nn.Linear(3, 3).to("neuron")
        assert type(lin.weight) is NeuronTensor and isinstance(lin.weight, torch.nn.Parameter)
        subs = [Sub(torch.ones(2)) for _ in range(50)]
        gone: list = []
        watch = [weakref.ref(t, gone.append) for t in subs]
        del subs
    assert len(gone) == len(watch) and sys.getrefcount(Sub) == refs
    assert torch.equal(lin(torch.ones(3, device="neuron")).cpu(), lin.cpu()(torch.ones(3)))


@needs_native_guard
def test_torchs_lookups_by_c_name_on_a_wrapper_answer_as_the_generic_lookup_does():
    # the wrapper type's tp_getattr (guard.cpp) answers torch's two lookups of every op and
    # property read without the generic lookup; any other name, and a subclass, as before
    import ctypes
    import sys

    from neuron_explorer.backend.tensor import NeuronTensor

    assert backend.runtime.guard.fast_attributes
    get = ctypes.pythonapi.PyObject_GetAttrString  # the C-string lookup, as torch's
    get.restype, get.argtypes = ctypes.py_object, [ctypes.py_object, ctypes.c_char_p]
    x = torch.ones(3, device="neuron")
    disabled = torch._C._disabled_torch_function_impl
    refs = sys.getrefcount(disabled)
    for _ in range(1000):
        assert get(x, b"__torch_function__") is disabled
        x.shape, x.dtype, x + x  # torch's own lookups of both names
    assert sys.getrefcount(disabled) == refs  # each answer a new reference, dropped
    assert get(x, b"__torch_dispatch__") == NeuronTensor.__torch_dispatch__
    assert get(x, b"_payload") is x._payload and get(x, b"__class__") is NeuronTensor
    for missing in (b"__torch_fn", b"no_such_attribute"):
        with pytest.raises(AttributeError):
            get(x, missing)

    seen: list = []

    class Sub(NeuronTensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func.__name__)
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))

    assert torch.equal((Sub(torch.ones(2)) + 1).cpu(), torch.full((2,), 2.0)) and seen == ["add"]


@needs_native_guard
@pytest.mark.parametrize("cleared", [True, False])
def test_a_capture_after_an_undrained_one_starts_no_span_before_its_op(cleared):
    # a capture that ends without a drain leaves the record callback on: the unrecorded ops
    # after it still write record starts, which the next capture's first op must not take
    from neuron_explorer.backend.runtime import events

    x = torch.randn(8, 8, device="neuron")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        x.view(-1)  # recorded, never drained
    for _ in range(3):
        x + 1  # unrecorded
        x.view(-1)
    if cleared:
        events.clear()
    t_before = time.time_ns()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        x @ x
        x.view(-1)
    drained = events.drain()
    calls = [
        e for e in drained if e.kind in ("runtime", "cut") and e.host_start_ns > t_before - 10**9
    ]
    assert [e.op_name for e in calls][-2:] == ["aten::mm", "aten::view"]
    assert all(t_before <= e.host_start_ns <= e.host_end_ns for e in calls[-2:])


@pytest.mark.skipif(backend.runtime.guard.kind != "native", reason="needs the C++ guard")
def test_torch_accelerator_memory_api_reads_the_devices_accounting():
    # torch.accelerator's memory functions read the device type's DeviceAllocator (guard.cpp):
    # they hit an internal assert before; now they give torch.neuron's figures (issue 28)
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    assert base == torch.neuron.memory_allocated()
    x = torch.empty(1000, device="neuron")  # 4,000 bytes
    y = torch.empty(500, device="neuron")
    assert torch.accelerator.memory_allocated() == base + 6000
    del y
    assert torch.accelerator.memory_allocated() == base + 4000
    assert torch.accelerator.max_memory_allocated() == base + 6000
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == base + 4000
    assert stats["allocated_bytes.all.peak"] == base + 6000
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == base + 4000
    assert torch.neuron.max_memory_allocated() == base + 4000
    del x

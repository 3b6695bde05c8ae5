"""Runtime events: recorded only under torch.profiler, on one clock, linked to launches and lines."""

from __future__ import annotations

import time

import torch

from neuron_explorer import backend
from neuron_explorer.backend.runtime import events as ev_mod
from neuron_explorer.backend.runtime import model


def _record(fn):
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        out = fn()
    return out, backend.events.drain()


def test_nothing_is_recorded_without_a_profiler():
    backend.events.clear()
    x = torch.randn(16, 16, device="neuron")
    (x @ x).relu().sum().item()
    print(x[0, :2])
    torch.neuron.synchronize()
    assert ev_mod.pending() == 0 and backend.events.drain() == []


def test_a_launch_its_kernel_and_instructions_share_a_flow_and_the_user_line():
    x = torch.randn(32, 64, device="neuron")
    w = torch.randn(64, 128, device="neuron")
    t_before = time.time_ns()
    line = test_a_launch_its_kernel_and_instructions_share_a_flow_and_the_user_line.__code__
    _, events = _record(lambda: x @ w)
    t_after = time.time_ns()
    launch = next(e for e in events if e.kind == "runtime" and e.op_name == "aten::mm")
    kernel = next(e for e in events if e.kind == "kernel" and e.flow_id == launch.flow_id)
    work = [e for e in events if e.parent_id == kernel.id]
    assert launch.layer == "host" and kernel.layer == "device"
    assert t_before <= launch.host_start_ns <= launch.host_end_ns <= t_after
    assert launch.host_cost_ns == model.spec().runtime.launch_ns
    assert launch.shapes == ((32, 64), (64, 128)) and launch.dtypes == ("float32", "float32")
    assert kernel.flops == 2 * 32 * 64 * 128 and kernel.track == "kernels"
    assert {e.kind for e in work} == {"instruction", "dma"}
    assert any(e.track == "TensorE" for e in work)
    assert any(e.track.startswith("DMA q") for e in work)
    assert all(e.flow_id == launch.flow_id for e in work)
    assert kernel.device_start_ns <= min(e.device_start_ns for e in work)
    for e in (launch, kernel, *work):
        assert e.src_file == __file__ and e.src_func == "<lambda>"
        assert line.co_firstlineno < e.src_line < line.co_firstlineno + 10


def test_first_use_compiles_once_per_key_then_hits_the_cache():
    def step():
        a = torch.ones(7, 3, device="neuron")
        for _ in range(3):
            a = a.tanh()
        return a

    _, events = _record(step)
    compiles = [e for e in events if e.kind == "compile" and e.op_name == "aten::tanh"]
    launches = [e for e in events if e.kind == "runtime" and e.op_name == "aten::tanh"]
    assert len(launches) == 3 and len(compiles) <= 1  # it may have compiled in an earlier test
    if compiles:
        assert compiles[0].host_cost_ns == model.spec().runtime.eager_compile_ns


def test_device_time_follows_the_modeled_clock_and_a_sync_waits_for_the_device():
    big = torch.randn(512, 512, device="neuron")

    def work():
        y = big
        for _ in range(3):
            y = y @ big
        return y.sum().item()

    work()  # compile first: a 3 ms eager compile would let the device drain
    _, events = _record(work)
    kernels = [e for e in events if e.kind == "kernel"]
    ends = [k.device_start_ns + k.device_dur_ns for k in kernels]
    assert all(
        b.device_start_ns >= a.device_start_ns for a, b in zip(kernels, kernels[1:], strict=False)
    )
    sync = next(e for e in events if e.kind == "sync" and e.name == ".item()")
    # the sync starts before the device drains, and its modeled cost covers the wait
    sync_modeled_start = sync.host_start_ns - sync.cut_before_ns
    # real time between ops (Python, torch.profiler, a busy machine) stays on the host clock,
    # so whether the device is still busy depends on the machine; the wait is exactly the gap
    assert sync.args["wait_ns"] == max(0, max(ends) - sync_modeled_start)
    rt = model.spec().runtime
    assert sync.host_cost_ns == sync.args["wait_ns"] + rt.sync_ns + int(
        4 * 1e9 / rt.d2h_bytes_per_s
    )
    launch_starts = [e.host_start_ns - e.cut_before_ns for e in events if e.kind == "runtime"]
    for k, start in zip(kernels, launch_starts, strict=True):
        assert k.device_start_ns >= start  # a kernel never starts before its launch


def test_backward_kernels_carry_the_forward_ops_sequence_number():
    x = torch.randn(4, 8, device="neuron", requires_grad=True)
    w = torch.randn(8, 8, device="neuron", requires_grad=True)

    def step():
        y = torch.mm(x, w)
        y.sum().backward()

    _, events = _record(step)
    fwd = next(e for e in events if e.kind == "runtime" and e.op_name == "aten::mm")
    bwd = [e for e in events if e.kind == "runtime" and e.is_backward]
    assert not fwd.is_backward and fwd.seq_nr >= 0
    assert any(e.op_name == "aten::mm" and e.seq_nr == fwd.seq_nr for e in bwd)


def test_a_view_that_launches_no_kernel_leaves_its_line_for_its_backward_kernels():
    x = torch.randn(8, 16, device="neuron", requires_grad=True)
    code = test_a_view_that_launches_no_kernel_leaves_its_line_for_its_backward_kernels.__code__

    def step():
        a, b = x.split(4, dim=0)  # a view: no kernel; its backward concatenates the grads
        (a * 2 + b).sum().backward()

    _, events = _record(step)
    marks = [e for e in events if e.kind == "forward"]
    assert marks and all(not e.is_backward and e.seq_nr >= 0 for e in marks)
    split = [e for e in marks if e.src_line == code.co_firstlineno + 5]
    assert len(split) == 1 and split[0].src_file == code.co_filename
    bwd = [e for e in events if e.kind == "kernel" and e.is_backward]
    assert any(e.seq_nr == split[0].seq_nr for e in bwd), [(e.name, e.seq_nr) for e in bwd]
    assert not any(
        e.seq_nr == split[0].seq_nr for e in events if e.kind == "kernel" and not e.is_backward
    )


def test_copies_fallbacks_and_memory_are_events():
    host = torch.randn(256, 256)

    def step():
        d = host.to("neuron")
        torch.nonzero(d > 0)
        d.cpu()
        torch.neuron.synchronize()
        del d

    _, events = _record(step)
    kinds = {(e.kind, e.name) for e in events}
    assert ("copy", "copy h2d") in kinds and ("copy", "copy d2h") in kinds
    assert ("fallback", "fallback") in kinds and ("sync", "torch.neuron.synchronize") in kinds
    h2d = next(e for e in events if e.name == "copy h2d")
    assert h2d.args["bytes"] == 256 * 256 * 4 and h2d.host_cost_ns > 0
    memory = [e for e in events if e.kind == "memory"]
    assert any(e.args["delta_bytes"] == 256 * 256 * 4 for e in memory)
    assert any(e.args["delta_bytes"] == -256 * 256 * 4 for e in memory)


def test_a_memory_event_sits_on_the_one_clock_where_it_happened():
    # the cut it carries is the running cut when the op allocated (that of the op's own
    # launch), not the total after every later call
    x = torch.randn(96, 96, device="neuron")
    (x * 3).sum()  # compiled before recording: no compile inside the recorded window

    def step():
        y = x * 3
        for _ in range(40):
            x.add_(1.0)
        return y

    _, events = _record(step)
    launch = next(e for e in events if e.kind == "runtime" and e.op_name == "aten::mul")
    alloc = next(e for e in events if e.kind == "memory" and e.args["delta_bytes"] == 96 * 96 * 4)
    later = [e for e in events if e.kind == "runtime" and e.id > launch.id]
    assert len(later) >= 40 and later[-1].cut_before_ns != launch.cut_before_ns
    assert alloc.cut_before_ns == launch.cut_before_ns
    assert launch.host_start_ns <= alloc.host_start_ns <= launch.host_end_ns


def test_instruction_events_are_capped():
    x = torch.randn(64, 64, device="neuron")
    ev_mod.set_instruction_limit(0)
    try:
        _, events = _record(lambda: [x @ x for _ in range(3)])
    finally:
        ev_mod.set_instruction_limit(ev_mod.DEFAULT_INSTRUCTION_LIMIT)
    assert sum(e.kind == "kernel" for e in events) == 3
    assert not any(e.kind in ("instruction", "dma") for e in events)


def test_payload_ops_are_hidden_from_the_torch_profiler():
    x = torch.randn(8, device="neuron")
    with torch.profiler.profile() as prof:
        x.add(1)
    adds = [e for e in prof.events() if e.name == "aten::add"]
    assert len(adds) == 1
    backend.events.clear()


def test_a_device_bound_sequence_makes_the_host_wait_in_the_sync():
    x = torch.randn(16 * 1024 * 1024, device="neuron")  # 64 MiB: each sum streams it from HBM

    def work():
        for _ in range(6):
            x.sum()
        return x.sum().item()

    work()  # compile first
    _, events = _record(work)
    kernels = [e for e in events if e.kind == "kernel"]
    launch_cost = sum(e.host_cost_ns for e in events if e.kind == "runtime")
    busy = sum(k.device_dur_ns for k in kernels)
    assert busy > 5 * launch_cost  # launches are cheap, the device is the bottleneck
    sync = next(e for e in events if e.name == ".item()")
    end = max(k.device_start_ns + k.device_dur_ns for k in kernels)
    assert sync.args["wait_ns"] > 0
    assert sync.host_start_ns - sync.cut_before_ns + sync.args["wait_ns"] == end


def test_module_names_do_not_keep_a_deleted_model_alive():
    # the module-path cache holds weak references: a model the user drops is collected, and a
    # new model (whose modules may reuse the old ids) gets its own names
    import gc
    import weakref

    from torch import nn

    def run(model):
        x = torch.randn(4, 8, device="neuron")
        _, events = _record(lambda: model(x).sum())
        return {e.module for e in events if e.kind == "kernel"}

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).to("neuron")
    assert {"0", "2"} <= run(model)
    dead = weakref.ref(model)
    del model
    gc.collect()
    assert dead() is None
    other = nn.Sequential(nn.Sequential(nn.Linear(8, 3))).to("neuron")
    assert "0.0" in run(other)


def test_every_raw_record_holds_exactly_the_fields_of_its_declared_layout():
    """Raw records are (layout, *fields) with a layout declared once in events.py (a
    NamedTuple): each record has exactly its layout's fields, so drain reads it by name."""
    layouts = (ev_mod.HostRecord, ev_mod.LaunchRecord, ev_mod.KernelRecord,
               ev_mod.ForwardRecord, ev_mod.MemoryRecord)  # fmt: skip
    backend.events.clear()
    x = torch.randn(24, 24, device="neuron", requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        loss = (x @ x).view(-1).relu().sum()  # a compile, launches, a view's forward marker
        loss.backward()
        loss.item()  # a sync
        raw = list(ev_mod._buf)
    seen = {r[0] for r in raw}
    assert set(layouts) - {ev_mod.KernelRecord} <= seen  # KernelRecord: compiled graphs only
    assert all(r[0] in layouts and len(r) == 1 + len(r[0]._fields) for r in raw)
    events = backend.events.drain()
    launches = [e for e in events if e.kind == "runtime" and e.name == "launch"]
    assert len(launches) == sum(r[0] is ev_mod.LaunchRecord for r in raw)
    assert {e.kind for e in events} >= {"compile", "runtime", "kernel", "sync", "memory", "forward"}


def test_a_launch_accounts_its_span_as_model_add_cut_does():
    """The hot path (record.dispatch_recorded) adds a launch's span less its modeled cost to the
    running cut without calling model.add_cut: the cut it records and the one it leaves must be
    add_cut's, replayed from the record's own fields."""
    x, y = torch.zeros(16, device="neuron"), torch.ones(16, device="neuron")
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        x.add_(y)
        x.add_(y)  # a compile cache hit: the hot path itself
        raw = ev_mod._buf[-1]
        after = model.cut_ns
    assert raw[0] is ev_mod.LaunchRecord
    rec = ev_mod.LaunchRecord._make(raw[1:])
    assert rec.t1 > rec.t0 and rec.cost > 0
    saved = model.cut_ns
    try:
        model.cut_ns = rec.cut
        assert model.add_cut(rec.t1 - rec.t0, rec.cost) == rec.cut
        assert model.cut_ns == after
    finally:
        model.cut_ns = saved
    backend.events.clear()


def test_in_place_results_are_the_same_recorded_or_not():
    """The recorded launch returns a plain in-place op's input wrapper without calling
    payload.wrap_result (record.dispatch_recorded); the unrecorded path calls it. Both must give
    the same wrapper, values and float64 rounding, and an out= op's restride, either way."""

    def run():
        x, y = torch.zeros(8, device="neuron"), torch.full((8,), 0.5, device="neuron")
        d, e = (
            torch.zeros(8, dtype=torch.float64, device="neuron"),
            torch.full((8,), 1 / 3, dtype=torch.float64, device="neuron"),
        )
        out = torch.empty(2, device="neuron")
        got = [x.add_(y) is x, d.add_(e) is d, torch.add(x, y, out=out) is out]
        return got, x.cpu(), d.cpu(), out.shape, out.cpu()

    plain = run()
    recorded, _events = _record(run)
    assert plain[0] == recorded[0] == [True, True, True]
    assert torch.equal(plain[1], recorded[1]) and plain[1][0].item() == 0.5
    assert torch.equal(plain[2], recorded[2])
    assert recorded[2][0].item() == torch.tensor(1 / 3, dtype=torch.float32).item()
    assert plain[3] == recorded[3] == (8,) and torch.equal(plain[4], recorded[4])


def test_each_op_carries_its_own_autograd_node_however_ops_without_one_interleave():
    # record.dispatch_recorded reads no input's requires_grad when the autograd sequence number
    # has not moved since the thread's last recorded op: a node made elsewhere in between (a
    # CPU op recording grad) must not be taken for the next op's, nor hide one op's own node
    w = torch.randn(8, device="neuron", requires_grad=True)
    plain = torch.randn(8, device="neuron")
    cpu = torch.randn(8, requires_grad=True)

    def step():
        a = w * 2  # records grad: its own node
        b = plain + 1  # none
        c = cpu * 3  # a CPU node in between
        d = plain - 1  # still none, though the number moved
        e = w.exp()  # right after the CPU node: its own
        f = plain.neg()
        (a.sum() + e.sum() + c.sum()).backward()
        return b, d, f

    _, events = _record(step)
    fwd: dict = {}
    for e in events:  # the first of each op: the sums and their add come after
        if e.kind == "runtime" and not e.is_backward:
            fwd.setdefault(e.op_name, e)
    assert fwd["aten::add"].seq_nr == fwd["aten::sub"].seq_nr == fwd["aten::neg"].seq_nr == -1
    mul, exp = fwd["aten::mul"].seq_nr, fwd["aten::exp"].seq_nr
    assert mul >= 0 and exp > mul + 1  # the CPU op's node and the sum's come between them
    bwd = [e for e in events if e.kind == "runtime" and e.is_backward]
    # backward kernels run the nodes of the forward ops (capture gives them their lines)
    assert {mul, exp} <= {e.seq_nr for e in bwd}
    assert fwd["aten::mul"].src_func == fwd["aten::exp"].src_func == "step"

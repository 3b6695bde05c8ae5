"""The recorded dispatch path, taken only while a torch.profiler session records.

Each runtime call records its real span inside the backend and its modeled host cost, and
advances the one clock (model.py); kernels go to the DeviceTimeline at their modeled launch.
"""

from __future__ import annotations

import time

import torch
from torch.autograd import profiler as _prof

from neuron_explorer.backend.runtime import collectives as _cc
from neuron_explorer.backend.runtime import events, model, tracking
from neuron_explorer.backend.runtime import hostcost as _hostcost
from neuron_explorer.backend.runtime.events import ForwardRecord, KernelRecord, LaunchRecord
from neuron_explorer.backend.runtime.payload import (
    finish_outputs,
    run_hidden,
    run_payload,
    unwrap_all,
    wrap,
    wrap_result,
)
from neuron_explorer.backend.runtime.source import call_site

__all__ = ["autograd_position", "dispatch_recorded", "dtype_name", "host_call", "run_hidden",
           "submit_kernel", "submit_neff"]  # fmt: skip

_now = time.time_ns
_tid = events.native_tid
_local = events._thread  # native_tid's per-thread cache, read without a call on the hot path
_DTYPE_NAMES: dict = {}
_grad_enabled = torch.is_grad_enabled
_current_node = torch._C._current_autograd_node
_sequence_nr = torch._C._autograd._get_sequence_nr
_F64 = torch.float64
_Tensor = torch.Tensor
_pending = model._pending  # kernels waiting to be placed on the device timeline
_cc_pending = _cc.pending  # storages an overlapped collective still uses
_buf = events._buf
_ids = events._ids
_flows = events._flows
_note_key = tracking.note_key  # (key, compiles now, cache entry) of one kernel call
_sig_get, _sig_set = tracking.compile_sig.get, tracking.compile_sig.__setitem__
_MATMUL: dict[str, bool] = {}  # op name -> its plan reads operand layout (costmodel MATMUL)
_host = events.record_host  # one host call, the clock advanced by its cut
_gaps = _hostcost.GAPS  # the refit's samples (cleared, never rebound): read without a lookup
_queued = _hostcost.QUEUED_NS  # [run-queue delay and stalls cut so far] (never rebound)


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _describe(payloads) -> tuple[tuple, tuple]:
    return (
        tuple(tuple(p.shape) for p in payloads),
        tuple(dtype_name(p.dtype) for p in payloads),
    )


def autograd_position(inputs: list | None = None) -> tuple[int, bool]:
    """(sequence number, in backward): backward kernels carry their forward op's number.

    A forward op gets the number of the autograd node it just created, so only when it
    records grad (some input requires grad); otherwise -1.
    """
    node = _current_node()
    if node is not None:
        return node._sequence_nr(), True
    if inputs is not None:
        if not _grad_enabled():
            return -1, False
        for _p, w in inputs:  # a loop: cheaper than any() over a generator, once per op
            if w.requires_grad:
                break
        else:
            return -1, False
    return _sequence_nr() - 1, False


def _note_forward(seq: int, tid: int) -> None:
    """A metadata op that made autograd node `seq`: remember its user line by the node's
    number, for the backward kernels that node launches (they have no forward kernel to
    inherit from)."""
    site = call_site(4)  # (stack id, module): what its backward kernels inherit
    if site[0] >= 0:
        _buf.append((ForwardRecord, next(_ids), tid, _now(), model.cut_ns, seq, site))


def _tensor_infos(payloads):
    from neuron_explorer.backend.costmodel import TensorInfo

    # the device computes float64 as float32, so that is what its kernels move and compute
    return [
        TensorInfo(
            shape=tuple(p.shape),
            dtype="float32" if p.dtype is _F64 else dtype_name(p.dtype),
            transposed=is_transposed(p),
        )
        for p in payloads
    ]


def is_transposed(t: torch.Tensor) -> bool:
    """A column-major view of a matrix (`w.t()`, `x.transpose(-1, -2)`)."""
    try:
        return t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) > 1 and t.shape[-2] > 1
    except (RuntimeError, TypeError):  # no strides (sparse, symbolic)
        return False


def _signature(info, inputs: list, new: list) -> tuple:
    """What a kernel's plan depends on beyond its inputs' shapes and dtypes (the cache key):
    its outputs (a reduction's dim, a backward's output mask) and, for a matmul, which operands
    are transposed views (a K-major A needs no transposes on TensorE)."""
    outs = tuple([w._meta for w in new])
    is_mm = _MATMUL.get(info.name)
    if is_mm is None:
        from neuron_explorer.backend.costmodel import ops

        is_mm = _MATMUL[info.name] = ops.classify(info.name) == ops.MATMUL
    if not is_mm:
        return outs
    return outs, tuple([is_transposed(p) for p, _w in inputs])


def lower(info, in_payloads, out_payloads):
    from neuron_explorer.backend.costmodel import lower_op

    return lower_op(
        info.name,
        inputs=_tensor_infos(in_payloads),
        outputs=_tensor_infos(out_payloads),
        spec=model.spec(),
    )


def submit_kernel(plan, ready_ns, op, shapes, dtypes, tid, flow, src, seq, bwd, args=None):
    """Launch a kernel plan on the modeled device no earlier than ready_ns (device-relative).

    Only the launch is recorded here; the timeline places it when a sync or a drain needs it.
    """
    cell = [plan, ready_ns, None]  # placed by model.schedule_pending
    _pending.append(cell)
    _buf.append(
        (KernelRecord, next(_ids), plan.name, op, shapes, dtypes, tid, plan, cell, flow, src, seq,
         bwd, args, None)
    )  # fmt: skip


def submit_neff(neff, kernels, ready_ns, op, tid, flow, seq, bwd) -> None:
    """Launch a compiled graph's NEFF: its whole plan is one unit on the device timeline, and
    each fused group is recorded as a kernel whose instructions are a slice of it.
    `kernels` are (group, source site, event args) in the NEFF's group order."""
    cell = [neff.plan, ready_ns, None]  # placed by model.schedule_pending
    _pending.append(cell)
    for group, src, args in kernels:
        plan = group.plan
        _buf.append(
            (KernelRecord, next(_ids), plan.name, op, (), (), tid, plan, cell, flow, src, seq, bwd,
             args, group.instr_index)
        )  # fmt: skip


def dispatch_recorded(info, args: tuple, kwargs: dict, t0: int):
    """The recorded path of one op; `t0` is when the runtime call began (`dispatch`'s entry).

    A kernel launch is one raw record, the kernel and its launching call together (`drain`
    makes the two events of it): record time only takes what cannot wait, the clock readings,
    the user line, the autograd position and the running cut. The op's position (below) is
    taken once, here, for launches, metadata ops and fallbacks alike: every statement on this
    path is paid by every recorded op (issue 16: a Python call costs 300-500 instructions).
    """
    inputs: list = []
    cpu_args, kwargs = unwrap_all(args, kwargs, inputs, info)
    if inputs and type(inputs[0][0]) is not _Tensor:  # tracing with fake payloads: no launch
        return _unrecorded(info, run_hidden(info.call, cpu_args, kwargs), inputs)
    kernel = info.kernel
    if not kernel and not inputs:  # a metadata op of no tensor: nothing to record
        return _unrecorded(info, run_payload(info, cpu_args, kwargs), inputs)
    # The position: (sequence number, in backward, thread id, round trip to cut, span start).
    # A forward op carries the autograd node it made, a backward one the node it runs.
    try:
        st = _local.state  # this thread's [native tid, sequence number seen, round-trip slots]
    except AttributeError:
        st = _thread_state()
    seq, bwd = -1, False
    node = _current_node()
    if node is not None:
        seq, bwd = node._sequence_nr(), True
    elif _grad_enabled():
        # An op that records grad made its node before this call (autograd's kernel runs
        # first, and every Node takes the next sequence number): the number unchanged since
        # this thread's last recorded op means no node, exactly, and no input's requires_grad
        # needs reading (a property read on a wrapper subclass costs ~1.5k instructions)
        n = _sequence_nr()
        if n != st[1]:
            st[1] = n
            for _p, w in inputs:
                if w.requires_grad:
                    seq = n - 1
                    break
    last = model.last_end_ns
    slots = st[2]
    if slots is not None:  # the exact round trip from torch's own records (hostcost.exact)
        if not _hostcost.ON:
            _hostcost.resume(slots)
        s = slots[0]  # START
        if not (last < s <= t0):  # no record of its own (called by redispatch): from t0
            if not s:  # this thread's first, or our callback runs before a newer profiler's
                _hostcost.resume(slots)
            s = t0
        if slots[2] and last:  # WATCH: inside the previous op's record (autograd saving its
            o = s - last  # result): all the time since that op's span is its return, cut
        else:
            e = slots[3]  # WATCH_END
            if s != t0:
                slots[2] = slots[1]  # watch this op's record: its end is the next op's return
            o = e - last if last < e <= s else 0
            f = slots[4]  # FREE: the wrapper's frees since the previous op, cut with its return
            if f:
                slots[4] = 0
                o = min(o + f, s - last) if last else o
            q = slots[8]  # QUEUED: time off its CPU since that return (hostcost.exact)
            if q > 0 and last < e <= s and e < slots[7] <= t0:  # ENTRY_AT: this op's entry
                q = min(q, s - last - o)  # never more than the stretch the clock keeps
                if q > 0:
                    o += q
                    _queued[0] += q
        t0 = s
    else:
        o = _calibrated(t0 - last, seq >= 0 and not bwd, kernel and info.mutates)
    if not kernel:
        # A metadata op: no launch, it costs the device runtime nothing. Its span and the
        # round trip before it are simulator time, a clock-only cut; the position above was
        # taken before its payload op opens a record function (hostcost.exact)
        out = run_payload(info, cpu_args, kwargs)
        new: list = []
        result = wrap(out, inputs, new)
        if info.restrides:  # all finish_outputs does for an op with no kernel: refresh
            finish_outputs(info, new, inputs)
        model.cut_ns += o  # add_cut(o, 0): the round trip, before the span (as a launch's)
        if seq >= 0 and not bwd:  # made an autograd node: its backward kernels need its line
            _note_forward(seq, st[0])
        # measured exactly, the round trip is all cut: the op keeps the documented host cost
        # of a metadata op (spec.py); calibrated, the CPU's own view was left uncut instead
        cost = (model._spec or model.spec()).runtime.metadata_ns if _hostcost.EXACT else 0
        _host("cut", info.name, info.name, (), (), st[0], t0, _now(), cost, None, -1, False)
        return result
    src = call_site(3)  # (stack id, module path)
    tid = st[0]
    if not info.supported:
        model.cut_ns += o  # its round trip, as a launch's: the fallback's sync starts at t0
        shapes, dtypes = _describe([p for p, _w in inputs])
        return _fallback(info, cpu_args, kwargs, inputs, t0, src, seq, bwd, tid, shapes, dtypes)
    # the wrapper's round trip (hostcost.py) is simulator time too: measured exactly, the span
    # starts at the op's record and `o` is the previous op's return; calibrated, `o` stands
    # for both; either way cut before the span (capture/clock.py: right after the last call)
    c = model.cut_ns = model.cut_ns + o  # add_cut(o, 0) without a call: the hot path
    m0 = t0 - c - model.origin_ns  # modeled_now(t0): before this call's own cut
    key, compiled, entry = _note_key(info, inputs)
    out = run_payload(info, cpu_args, kwargs)
    new = []
    if inputs and out is inputs[0][0] and not info.restrides and out.dtype is not _F64:
        result = inputs[0][1]  # wrap_result's plain in-place case without a call (add_, mul_)
    else:
        result = wrap_result(info, out, inputs, new)
    rt = (model._spec or model.spec()).runtime  # the set spec without a call, once set
    compile_real = 0
    sig = _signature(info, inputs, new)
    if entry is not None and _sig_get(key) != sig:  # same inputs, other outputs or layout
        key = (key, sig)
        entry = tracking.compile_cache.get(key)
        compiled = entry is None
    if entry is None:  # first use while recording: lower the kernel (the eager compile)
        _sig_set(key, sig)
        entry, compile_real = _compile(info, key, compiled, inputs, new, tid, src, seq, bwd)
    launch = rt.launch_ns
    ready = m0 + launch + (rt.eager_compile_ns if compiled else 0)
    if _cc_pending:  # an overlapped collective's buffer: the kernel waits for the CC queue
        ready = _cc.ready_after(inputs, ready)
    # The launch owns the payload compute too: all of it is simulator time, cut from the host.
    t1 = _now() - compile_real
    cut = model.cut_ns  # model.add_cut(t1 - t0, launch) without a call (test_device_events)
    model.cut_ns = cut + (t1 - t0) - launch
    model.last_end_ns = t1 + compile_real  # the real end: the next op's cut starts there
    rec = [LaunchRecord, next(_ids), next(_ids), info.name, entry, tid, t0, t1, cut, src, seq,
           bwd, next(_flows), launch, entry[0], ready, None]  # fmt: skip
    _pending.append(rec)  # placed by model.schedule_pending: rec[-1] = place(plan, ready)
    _buf.append(rec)
    return result


def _thread_state() -> list:
    """This thread's [native tid, autograd sequence number last seen, round-trip slots or
    None], made on its first recorded op and read once per op after (a threading.local
    attribute costs ~500 instructions a read)."""
    st = _local.state = [_tid(), -1, _hostcost.thread_slots()]
    return st


def _calibrated(gap: int, grad: bool, mutates: bool) -> int:
    """The calibrated round trip (the Python guard: no exact one), capped by the gap."""
    o = _hostcost.OUTSIDE_NS
    if o is None:
        o = _hostcost.calibrate()
    if grad:
        o = _hostcost.OUTSIDE_GRAD_NS
    else:  # records no grad: the plain round trip's in-model sample (refit)
        _gaps.append(gap)
        if len(_gaps) >= _hostcost.BATCH:
            _hostcost.refit()
    if mutates and o > _hostcost.LOOP_NS:  # returns its input's wrapper: the short round trip
        o = _hostcost.LOOP_NS
    return o if gap >= o else max(gap, 0)


def _unrecorded(info, out, inputs: list):
    """A payload result wrapped and accounted, nothing recorded: an op on fake payloads while
    torch.compile traces, a metadata op of no tensor."""
    new: list = []
    result = wrap(out, inputs, new)
    finish_outputs(info, new, inputs)
    return result


def _compile(info, key, compiled: bool, inputs: list, new: list, tid, src, seq, bwd):
    """Lower a kernel on its first use while recording; (cache entry, real time it took when
    it is this call's eager compile, else 0)."""
    t_c = _now()
    in_payloads = [p for p, _w in inputs]
    outs = [w._payload for w in new] or ([in_payloads[0]] if info.mutates and inputs else [])
    entry = (lower(info, in_payloads, outs), *_describe(in_payloads))
    tracking.compile_cache[key] = entry
    t_l = _now()
    if not compiled:
        return entry, 0
    _host("compile", "compile", info.name, entry[1], entry[2], tid, t_c, t_l,
          model.spec().runtime.eager_compile_ns, src, seq, bwd, args={"cache": "miss"})  # fmt: skip
    return entry, t_l - t_c


def _fallback(info, cpu_args, kwargs, inputs, t0, src, seq, bwd, tid, shapes, dtypes):
    """CPU fallback: wait for the device, copy inputs out, compute on the CPU, copy results back."""
    spec = model.spec()
    tracking.warn_fallback(info.name)
    in_bytes = sum(p.untyped_storage().nbytes() for p, _w in inputs)
    wait = max(0, model.device_idle_at() - model.modeled_now(t0)) + spec.runtime.sync_ns
    t_w = _now()  # placing the queued kernels above is simulator time: the sync's span cuts it
    _host("sync", "sync", info.name, shapes, dtypes, tid, t0, t_w, wait, src, seq, bwd)
    d2h = _copy_ns(in_bytes, spec.runtime.d2h_bytes_per_s)
    t_cpu = _now()
    _host("copy", "copy d2h", info.name, shapes, dtypes, tid, t_w, t_cpu, d2h, src, seq, bwd,
          args={"bytes": in_bytes})  # fmt: skip
    out = run_payload(info, cpu_args, kwargs)
    t_done = _now()
    new: list = []
    result = wrap(out, inputs, new)
    finish_outputs(info, new, inputs)
    _host("fallback", "fallback", info.name, shapes, dtypes, tid, t_cpu, t_done, t_done - t_cpu,
          src, seq, bwd)  # fmt: skip
    out_bytes = sum(w._payload.untyped_storage().nbytes() for w in new)
    if info.mutates:
        out_bytes += inputs[0][0].untyped_storage().nbytes() if inputs else 0
    t1 = _now()
    h2d = _copy_ns(out_bytes, spec.runtime.h2d_bytes_per_s)
    _host("copy", "copy h2d", info.name, shapes, dtypes, tid, t_done, t1, h2d, src, seq, bwd,
          args={"bytes": out_bytes})  # fmt: skip
    return result


def _copy_ns(nbytes: int, bytes_per_s: float) -> int:
    return int(nbytes * 1e9 / bytes_per_s) if nbytes else 0


class host_call:
    """A copy or sync on the host: when recording, one event with its modeled cost.

    A device-to-host transfer first waits for the device to drain, as on the real chip.
    """

    __slots__ = ("kind", "name", "op", "payloads", "direction", "t0", "src")

    def __init__(self, kind: str, name: str, op: str, payloads, direction: str = "") -> None:
        self.kind, self.name, self.op = kind, name, op
        self.payloads, self.direction = payloads, direction
        self.t0 = 0

    def __enter__(self):
        if _prof._is_profiler_enabled:
            t0 = _now()
            if self.op:  # an aten op's (a copy, .item()): its record's round trip is cut too
                o, t0 = _hostcost.round_trip(t0)
                model.cut_ns += o  # add_cut(o, 0): the previous op's return, before the span
            self.t0 = t0
            self.src = call_site(2)
        return self

    def __exit__(self, *exc) -> None:
        if not self.t0:
            return
        spec = model.spec()
        rt = spec.runtime
        nbytes = sum(p.untyped_storage().nbytes() for p in self.payloads)
        cost = 0
        wait = 0
        if self.direction == "d2h" or self.kind == "sync":
            wait = max(0, model.device_idle_at() - model.modeled_now(self.t0))
            cost += wait + rt.sync_ns
        if self.direction:
            bw = rt.h2d_bytes_per_s if self.direction == "h2d" else rt.d2h_bytes_per_s
            cost += _copy_ns(nbytes, bw)
        shapes, dtypes = _describe(self.payloads)
        seq, bwd = autograd_position()
        # the span ends after device_idle_at() placed the queued kernels: that is simulator
        # work (hundreds of microseconds behind a long queue) and must be cut with the rest
        t1 = _now()
        _host(self.kind, self.name, self.op, shapes, dtypes, _tid(), self.t0, t1, cost, self.src,
              seq, bwd, args={"bytes": nbytes, "direction": self.direction, "wait_ns": wait})  # fmt: skip

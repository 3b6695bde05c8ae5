"""The device in torch.profiler's own output: a Kineto PrivateUse1 plugin (docs/device.md).

At registration we build kineto_plugin.cpp with g++ (as guard.py builds guard.cpp), cache it
and load it; its static initialiser registers the plugin with torch
(REGISTER_PRIVATEUSE1_PROFILER). While `ProfilerActivity.PrivateUse1` is profiled, Kineto
asks the plugin for its activities when the profiler stops; the plugin calls `_collect` here,
which drains the runtime's events (and hands them back for trace_handler, which drains after)
and gives the plugin one activity for each runtime call (on its thread, as cudaLaunchKernel is
in a CUDA trace) and for each kernel, collective and copy on the device's lanes. Without a
compiler, or with NEURON_KINETO_PLUGIN=0, nothing is registered and torch.profiler records no
device work, as before.

Torch.profiler's CPU ops are on the real clock, the simulator's own time included, while the
device is modeled on the one clock (runtime/model.py): real minus the cut. Device work is put
back on the real clock through the runtime calls' anchors (a call's real start is its modeled
start; its real end, its modeled end), keeping each kernel's modeled duration, and one kernel
never overlaps the one before it on its lane. Each activity's args carry the modeled times.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import torch

from neuron_explorer.backend.runtime import events, events_codec, guard, memory, model
from neuron_explorer.backend.runtime.drained import Drained
from neuron_explorer.vocab.engines import COLLECTIVE_TRACK, KERNEL_TRACK
from neuron_explorer.vocab.kinds import NEURON_HOST_KINDS

_SOURCE = Path(__file__).with_name("kineto_plugin.cpp")
# Kineto's activity types (kineto/ActivityType.h), the ones torch asks for with PrivateUse1
GPU_MEMCPY, CONCURRENT_KERNEL, PRIVATEUSE1_RUNTIME = 3, 5, 24
COPY_TRACK = "copies"
# resource ids on the device, also each activity's "stream" arg (HTA reads stream >= 0 as GPU work)
LANES = {KERNEL_TRACK: 1, COLLECTIVE_TRACK: 2, COPY_TRACK: 3}
HOST_KINDS = NEURON_HOST_KINDS  # runtime calls shown on threads
ID_ARG = "neuron id"  # every activity's RuntimeEvent id: capture drops them from the host trace
WINDOW_SLACK_NS = 1_000_000  # runtime calls this close outside the profiler's window still count

_json = msgspec.json.Encoder(enc_hook=str).encode
_keep: list = []
native: ctypes.CDLL | None = None  # the plugin once loaded


def build(path: Path) -> None:
    """Compile kineto_plugin.cpp into `path` (atomically), against torch's Kineto headers."""
    guard.build(path, _SOURCE, includes=("kineto",))


def install() -> bool:
    """Build (once), load and register the plugin; False where it cannot be (no compiler,
    NEURON_KINETO_PLUGIN=0, a torch without Kineto's plugin registry)."""
    global native
    if os.environ.get("NEURON_KINETO_PLUGIN") == "0":
        return False
    try:
        path = guard._library_path(_SOURCE, "neuron_kineto")
        if not path.exists():
            build(path)
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        if shutil.which("g++") or shutil.which("c++") or os.environ.get("CXX"):
            # without a compiler the guard's warning says it already
            warnings.warn(f"neuron: torch.profiler will show no device work (the Kineto plugin "
                          f"did not load: {str(exc)[-300:]})", RuntimeWarning, stacklevel=2)  # fmt: skip
        return False
    lib.neuron_kineto_add.argtypes = [
        ctypes.c_int, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_uint32, ctypes.c_int, ctypes.c_int32, ctypes.c_int64,
        ctypes.c_char_p,
    ]  # fmt: skip
    lib.neuron_kineto_lane.argtypes = [ctypes.c_int32, ctypes.c_char_p]
    lib.neuron_kineto_metadata.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    for name, rid in LANES.items():
        lib.neuron_kineto_lane(rid, name.encode())
    callback = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64)(_collect)
    lib.neuron_kineto_set_collect(callback)
    lib.neuron_kineto_memory.argtypes = [ctypes.c_int64] * 4
    lib.neuron_kineto_memory.restype = None
    memory.ON_PROFILED = lib.neuron_kineto_memory  # profile_memory=True sees the device's memory
    _keep.extend([lib, callback])
    native = lib
    return bool(lib.neuron_kineto_registered())


def _collect(start_ns: int, end_ns: int) -> None:
    """Kineto's processTrace: hand the plugin this window's activities (never raises)."""
    drained: Sequence[Any] = []
    try:
        drained = events.drain()
        window = in_window(drained, start_ns - WINDOW_SLACK_NS, end_ns + WINDOW_SLACK_NS)
        events.keep(window)  # trace_handler drains after the profiler stops
        drained = []
        lib = native
        if lib is None or not window:
            return
        for a in activities(window):
            lib.neuron_kineto_add(*a)
        text = events_codec.encode(window, _device_spec(), torch.__version__)
        lib.neuron_kineto_metadata(events_codec.TRACE_KEY.encode(), f'"{text}"'.encode())
    except Exception:  # noqa: BLE001 - never raise across the C boundary
        events.keep(drained)  # whatever happened, trace_handler still gets the events


def _device_spec() -> dict[str, Any] | None:
    """The chip's spec with this host's measured costs, as trace_handler's manifest holds it."""
    try:
        return model.spec().to_dict()
    except Exception:  # noqa: BLE001 - a missing or broken cost model leaves the spec out
        return None


def in_window(drained: Sequence[Any], lo_ns: int, hi_ns: int) -> Sequence[Any]:
    """The events of runtime calls inside [lo, hi] (real ns) and the device work they caused;
    an earlier profile's events left undrained (no trace_handler) are dropped. Drained events
    stay so: a kernel's instruction rows are built only when read (drained.py)."""
    built = drained.whole() if isinstance(drained, Drained) else drained
    calls = {e.id for e in built if e.host_start_ns is not None
             and lo_ns <= e.host_end_ns and e.host_start_ns <= hi_ns}  # fmt: skip
    flows = {e.flow_id for e in built if e.id in calls and e.flow_id}
    kernels = {e.id for e in built if e.host_start_ns is None and e.flow_id in flows}

    def keep(e: Any) -> bool:
        return e.id in calls or e.id in kernels or e.parent_id in kernels

    if isinstance(drained, Drained):
        return drained.select(keep)
    return [e for e in drained if keep(e)]


def activities(drained: Sequence[Any]) -> list[tuple]:
    """neuron_kineto_add's arguments for each runtime call, kernel, collective and copy."""
    if isinstance(drained, Drained):  # none of these is a kernel's instruction or DMA row
        drained = drained.whole()
    host = [e for e in drained if e.host_start_ns is not None]
    to_real = RealClock(host)
    launch = {e.flow_id: e for e in host if e.flow_id and e.kind in HOST_KINDS}
    device_flows = {e.flow_id for e in drained if e.kind in ("kernel", "collective")}
    out: list[tuple] = []
    for e in host:
        if e.kind not in HOST_KINDS:
            continue
        meta = {ID_ARG: e.id, "kind": e.kind, "op": e.op_name, "modeled dur ns": e.host_cost_ns,
                "cut before ns": e.cut_before_ns, "correlation": e.flow_id}  # fmt: skip
        starts = e.kind == "runtime" and e.flow_id in device_flows
        # its modeled cost, within its real span: the span also holds the payload's CPU ops,
        # which key_averages counts under the same op
        end = e.host_start_ns + min(max(e.host_cost_ns, 0), e.host_end_ns - e.host_start_ns)
        out.append((PRIVATEUSE1_RUNTIME, e.name.encode(), -1, 0, e.host_start_ns, end,
                    e.flow_id if starts else 0, 1, e.tid, e.host_end_ns, _meta(meta)))  # fmt: skip
        if e.kind == "copy" and e.args.get("direction"):
            out.append(_copy(e, to_real))
    lane_end: dict[str, int] = {}
    for e in sorted((e for e in drained if e.kind in ("kernel", "collective")),
                    key=lambda e: e.device_start_ns):  # fmt: skip
        lane = KERNEL_TRACK if e.kind == "kernel" else COLLECTIVE_TRACK
        start = max(int(to_real(e.device_start_ns)), lane_end.get(lane, 0))
        end = start + e.device_dur_ns
        lane_end[lane] = end
        by = launch.get(e.flow_id)
        meta = {ID_ARG: e.id, "kind": e.kind, "op": e.op_name, "correlation": e.flow_id,
                "device": 0, "stream": LANES[lane], "modeled start ns": e.device_start_ns, "modeled dur ns": e.device_dur_ns,
                "flops": e.flops, "bytes read": e.bytes_read, "bytes written": e.bytes_written}  # fmt: skip
        out.append((CONCURRENT_KERNEL, e.name.encode(), 0, LANES[lane], start, end,
                    e.flow_id if by is not None else 0, 0, by.tid if by else e.tid,
                    by.host_end_ns if by else 0, _meta(meta)))  # fmt: skip
    return out


def _copy(e: Any, to_real: RealClock) -> tuple:
    """A host-device copy's transfer on the device's copy lane: what follows the wait for the
    device (a device-to-host copy waits for it to drain first)."""
    wait = int(e.args.get("wait_ns", 0))
    dur = max(0, e.host_cost_ns - wait)
    start = int(to_real(e.host_start_ns - e.cut_before_ns + wait))
    name = "Memcpy HtoD" if e.args["direction"] == "h2d" else "Memcpy DtoH"
    meta = {ID_ARG: e.id, "kind": "copy", "op": e.op_name, "bytes": e.args.get("bytes", 0),
            "device": 0, "stream": LANES[COPY_TRACK], "modeled dur ns": dur}  # fmt: skip
    return (GPU_MEMCPY, name.encode(), 0, LANES[COPY_TRACK], start, start + dur, 0, 0, e.tid,
            e.host_end_ns, _meta(meta))  # fmt: skip


def _meta(values: dict[str, Any]) -> bytes:
    """Args as the plugin takes them: "key=raw JSON" lines. Kineto turns a backslash into '/',
    so a string that JSON would escape loses its quotes and backslashes instead."""
    lines = []
    for k, v in values.items():
        text = _json(v)
        if b"\\" in text:
            text = _json("".join(c for c in str(v) if c >= " " and c not in '\\"'))
        lines.append(b"%s=%s" % (k.encode(), text))
    return b"\n".join(lines)


class RealClock:
    """The one clock's modeled times (real minus the cut, ns) back on the real clock, through
    the runtime calls' anchors; slope 1 before the first call and after the last."""

    def __init__(self, calls: Sequence[Any]) -> None:
        import numpy as np

        real, modeled = [], []
        for c in sorted(calls, key=lambda c: c.host_start_ns):
            m0 = c.host_start_ns - c.cut_before_ns
            real += [c.host_start_ns, max(c.host_end_ns, c.host_start_ns)]
            modeled += [m0, m0 + max(c.host_cost_ns, 0)]
        self.real = np.array(real, dtype=np.int64)
        self.modeled = np.maximum.accumulate(np.array(modeled, dtype=np.int64)) if real else None

    def __call__(self, m: int) -> int:
        import numpy as np

        r, mod = self.real, self.modeled
        if mod is None:
            return m
        if m <= mod[0]:
            return int(m + (r[0] - mod[0]))
        if m >= mod[-1]:
            return int(m + (r[-1] - mod[-1]))
        i = int(np.searchsorted(mod, m, side="right"))  # the first anchor past m
        m0, m1, r0, r1 = int(mod[i - 1]), int(mod[i]), int(r[i - 1]), int(r[i])
        return r0 + (m - m0) * (r1 - r0) // (m1 - m0) if m1 > m0 else r1

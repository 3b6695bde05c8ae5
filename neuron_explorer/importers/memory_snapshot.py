"""A memory snapshot (`torch.cuda.memory._dump_snapshot`, `torch.neuron.memory._dump_snapshot`)
into a profile: each allocation an `allocation` event, and the device's memory_allocated counter.

The snapshot's history (`device_traces`) is read in order: an `alloc` opens an allocation at its
address, a `free_completed` closes it. A free of an address the history never saw allocated, and
a live block of `segments` the history never saw allocated, were allocated before the history
began: they start at the profile's origin. Allocations still open at the end end just after the
last entry. So the counter is exact from the origin on: its value at any time is the bytes of
the allocations alive then, and the allocations alive at its peak add up to the peak.

Each allocation event (layer device, kind allocation, track "allocations") carries its size and
address in `args` (`bytes`, `addr`), its Python stack in the stacks table (C++ frames are left
out), its innermost user line (`src_*`), its innermost model-code line (`model_*`) and, for the
device's own snapshots, its nn.Module path (`module`). Times are the entries' `time_us`, made
strictly increasing (a nanosecond apart where entries share a microsecond, or have no time, as a
profiler's snapshot has none), so no two changes of the counter share a sample. Each device is
labelled from the snapshot itself (`device_labels`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadInputError
from ..model.io import ProfileWriter
from ..model.manifest import Manifest
from ..vocab import frames as scopes
from . import safe_pickle
from .sources import select

SUFFIXES = (".pickle", ".pkl")
PICKLE_PROTOCOL_2_ON = b"\x80"  # a pickle of protocol 2 or later starts with PROTO
TRACK = "allocations"
MODEL_SCOPES = (scopes.USER, scopes.LIBRARY)
# a Python frame as torch.profiler names it, which a profiler's snapshot keeps as the frame's
# name (its filename "none", its line 0): "torch/nn/modules/linear.py(130): forward"
MODULE_PREFIX = "nn.Module: "  # a profiler's module frame, recorded with_modules=True
_PROFILER_FRAME = re.compile(r"(.+\.py)\((\d{1,9})\): (.*)", re.S)


def recognises(path: Path) -> bool:
    """A .pickle or .pkl file, or any file that starts as a pickle of protocol 2 or later."""
    if path.name.endswith(SUFFIXES):
        return True
    try:
        with path.open("rb") as f:
            return f.read(1) == PICKLE_PROTOCOL_2_ON
    except OSError:
        return False


_EVENT_COLUMNS = ("id", "rank", "layer", "kind", "name", "track", "device", "start_ns", "dur_ns",
                  "stack_id", "src_file", "src_line", "src_func", "module", "model_file",
                  "model_line", "model_func", "args")  # fmt: skip


@dataclass
class _Built:
    """The tables of one snapshot, filled as its devices are read."""

    events: dict[str, list] = field(default_factory=lambda: {k: [] for k in _EVENT_COLUMNS})
    counters: dict[str, list] = field(
        default_factory=lambda: {"rank": [], "track": [], "name": [], "ts_ns": [], "value": [],
                                 "unit": []})  # fmt: skip
    stacks: dict[str, list] = field(
        default_factory=lambda: {"stack_id": [], "depth": [], "file": [], "line": [],
                                 "function": [], "scope": []})  # fmt: skip
    stack_ids: dict[tuple, int] = field(default_factory=dict)


def import_snapshot(paths: Sequence[Path], out: Path, *, overwrite: bool = False,
                    source_roots: Sequence[Path] = (), **_ignored: object) -> Path:  # fmt: skip
    """Import one memory snapshot pickle into a profile directory at `out`, atomically; the
    user's and libraries' files its stacks name are kept when they lie under `source_roots` or
    the pickle's own directory (importers/sources.py)."""
    if len(paths) != 1:
        raise BadInputError(paths[0], "a memory snapshot is imported alone (one file)")
    path = Path(paths[0])
    data = _checked(path, safe_pickle.load(path))
    traces = data["device_traces"]
    live = _live_blocks(path, data["segments"], len(traces))
    timed = [_timed(path, i, t) for i, t in enumerate(traces)]
    starts = [t[0][0] for t in timed if t]
    origin = min(starts) - 1 if starts else 0  # the allocations from before the history
    built = _Built()
    labels = device_labels(data, max(len(traces), max(live, default=-1) + 1))
    for index, label in enumerate(labels):
        entries = timed[index] if index < len(timed) else []
        _read_device(path, built, label, entries, live.get(index, []), origin)
    with ProfileWriter(out, overwrite=overwrite) as writer:
        writer.write_events(built.events)
        writer.write_table("counters", built.counters)
        writer.write_table("stacks", built.stacks)
        named = {f for f, scope in zip(built.stacks["file"], built.stacks["scope"], strict=True)
                 if scope in MODEL_SCOPES}  # fmt: skip
        chosen = select(sorted(named), [*source_roots, path.resolve().parent])
        for name, text in chosen.kept:
            writer.add_source(name, text)
        manifest = Manifest(
            source="memory_snapshot", origin_unix_ns=max(0, origin), inputs=(str(path),),
            extra={"memory_snapshot": {"devices": labels, "made_by": _made_by(data),
                                       "timed": any("time_us" in e for t in timed for _ns, e in t),
                                       "entries": sum(len(t) for t in timed),
                                       "live_blocks": sum(len(b) for b in live.values())},
                   **chosen.manifest_extra()},
        )  # fmt: skip
        return writer.commit(manifest)


def _made_by(data: dict[str, Any]) -> str:
    """Who wrote the snapshot: "allocator" (torch.cuda.memory._snapshot and its kin, ours
    included: its segments carry a `segment_type`, its entries a `time_us`), or "profiler"
    (torch.cuda._memory_viz._profile_to_snapshot of a torch.profiler memory profile: neither)."""
    segments = [s for s in data["segments"] if isinstance(s, dict)]
    entries = [e for t in data["device_traces"] if isinstance(t, list) for e in t
               if isinstance(e, dict)]  # fmt: skip
    if not (segments or entries):
        return "allocator"
    if any("segment_type" in s for s in segments) or any("time_us" in e for e in entries):
        return "allocator"
    return "profiler"


def device_labels(data: dict[str, Any], devices: int) -> list[str]:
    """Each device index's label, from the snapshot itself: `device_type:N` where it names its
    type (the device's own snapshots: `neuron`); a profiler's snapshot has a trace per CUDA
    device and the host's last (its `to_device` puts every non-CUDA tensor there); an
    allocator's snapshot with no type is torch.cuda's (XPU's look the same)."""
    kind = data.get("device_type")
    if isinstance(kind, str) and kind:
        return [f"{kind}:{i}" for i in range(devices)]
    if _made_by(data) == "profiler":
        host = len(data["device_traces"]) - 1 if data["device_traces"] else devices - 1
        return ["cpu" if i == host else f"cuda:{i}" for i in range(devices)]
    return [f"cuda:{i}" for i in range(devices)]


def _checked(path: Path, data: Any) -> dict[str, Any]:
    if isinstance(data, list):  # segments only (torch.cuda.memory_snapshot()), as _memory_viz
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or not ("segments" in data or "device_traces" in data):
        raise BadInputError(path, "not a memory snapshot (no 'segments' or 'device_traces')")
    data = dict(data)
    for key in ("segments", "device_traces"):
        data.setdefault(key, [])
        if not isinstance(data[key], list):
            raise BadInputError(path, f"memory snapshot: '{key}' is not a list")
    return data


def _int(path: Path, where: str, d: dict, key: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if type(v) is not int or not -(2**62) < v < 2**62:
        raise BadInputError(path, f"memory snapshot: {where} has no integer '{key}'")
    return v


def _live_blocks(path: Path, segments: list, devices: int) -> dict[int, list[dict]]:
    """Per device index, the blocks allocated when the snapshot was taken."""
    live: dict[int, list[dict]] = {}
    for i, seg in enumerate(segments):
        where = f"segments[{i}]"
        if not isinstance(seg, dict) or not isinstance(seg.get("blocks", []), list):
            raise BadInputError(path, f"memory snapshot: {where} is not a segment")
        device = _int(path, where, seg, "device", 0)
        if not 0 <= device < 1 << 16:
            raise BadInputError(path, f"memory snapshot: {where} has device {device}")
        address = _int(path, where, seg, "address", 0)
        offset = 0
        for j, b in enumerate(seg.get("blocks", [])):
            if not isinstance(b, dict):
                raise BadInputError(path, f"memory snapshot: {where}.blocks[{j}] is not a block")
            size = _int(path, f"{where}.blocks[{j}]", b, "size")
            addr = _int(path, f"{where}.blocks[{j}]", b, "address", address + offset)
            offset += size
            if b.get("state") != "active_allocated":
                continue
            frames = b.get("frames")
            if frames is None and isinstance(b.get("history"), list) and b["history"]:
                frames = b["history"][0].get("frames") if isinstance(b["history"][0], dict) else None  # fmt: skip
            live.setdefault(device, []).append(
                {"addr": addr, "size": _int(path, f"{where}.blocks[{j}]", b, "requested_size", size),
                 "frames": frames, "module": b.get("module")})  # fmt: skip
    return live


def _timed(path: Path, device: int, trace: Any) -> list[tuple[int, dict]]:
    """(unix ns, entry) of each entry of a device's history, strictly increasing."""
    if not isinstance(trace, list):
        raise BadInputError(path, f"memory snapshot: device_traces[{device}] is not a list")
    out, last = [], None
    for k, e in enumerate(trace):
        where = f"device_traces[{device}][{k}]"
        if not isinstance(e, dict) or not isinstance(e.get("action"), str):
            raise BadInputError(path, f"memory snapshot: {where} is not a trace entry")
        us = e.get("time_us")
        ns = us * 1000 if type(us) is int and 0 <= us < 2**52 else None
        if last is not None and (ns is None or ns <= last):
            ns = last + 1
        elif ns is None:
            ns = 1
        out.append((ns, e))
        last = ns
    return out


def _read_device(path: Path, built: _Built, device: str, entries: list[tuple[int, dict]],
                 live: list[dict], origin: int) -> None:  # fmt: skip
    spans: list[tuple[int, int, dict, bool]] = []  # (start, end, what, before the history)
    open_: dict[int, tuple[int, dict]] = {}
    end = (entries[-1][0] if entries else origin) + 1
    for k, (ns, e) in enumerate(entries):
        action, where = e["action"], f"{device}'s trace entry {k}"
        if action == "alloc":
            addr = _int(path, where, e, "addr")
            what = {"addr": addr, "size": _int(path, where, e, "size"),
                    "frames": e.get("frames"), "module": e.get("module")}  # fmt: skip
            prior = open_.pop(addr, None)
            if prior is not None:  # allocated twice without a free between: the first ends
                spans.append((prior[0], ns, prior[1], prior[0] == origin))
            open_[addr] = (ns, what)
        elif action == "free_completed":
            addr = _int(path, where, e, "addr")
            opened = open_.pop(addr, None)
            if opened is None:  # allocated before the history began
                what = {"addr": addr, "size": _int(path, where, e, "size"), "frames": None,
                        "module": e.get("module")}  # fmt: skip
                spans.append((origin, ns, what, True))
            else:
                spans.append((opened[0], ns, opened[1], False))
    for b in live:  # alive at the snapshot: open in the history, or allocated before it
        opened = open_.pop(b["addr"], None)
        if opened is not None:
            spans.append((opened[0], end, {**opened[1], "frames": opened[1]["frames"] or b["frames"]}, False))  # fmt: skip
        else:
            spans.append((origin, end, b, True))
    for start, what in open_.values():  # the history's, never freed, not in a segment
        spans.append((start, end, what, False))
    spans.sort(key=lambda s: (s[0], s[1]))
    _add_events(built, device, spans, origin)
    _add_counter(built, device, spans, origin, end)


def _add_events(built: _Built, device: str, spans: list, origin: int) -> None:
    ev = built.events
    for start, end, what, before in spans:
        sid, user, model = _stack(built, what.get("frames"))
        module = what.get("module")
        if not isinstance(module, str):  # a profiler's snapshot: its nn.Module frames, if any
            module = _profiler_module(what.get("frames"))
        args = {"bytes": what["size"], "addr": what["addr"]}
        if before:
            args["before_history"] = True
        row = {"id": len(ev["id"]), "rank": 0, "layer": "device", "kind": "allocation",
               "name": "allocation", "track": TRACK, "device": device,
               "start_ns": start - origin, "dur_ns": max(1, end - start), "stack_id": sid,
               "src_file": user[0], "src_line": user[1], "src_func": user[2],
               "module": module if isinstance(module, str) else None,
               "model_file": model[0], "model_line": model[1], "model_func": model[2],
               "args": json.dumps(args)}  # fmt: skip
        for k, v in row.items():
            ev[k].append(v)


def _add_counter(built: _Built, device: str, spans: list, origin: int, last: int) -> None:
    """memory_allocated: the bytes alive after each change, one sample per change (the
    allocations alive at the snapshot, ending at `last`, are not freed: no change there)."""
    changes: dict[int, int] = {}
    for start, end, what, _before in spans:
        changes[start] = changes.get(start, 0) + what["size"]
        if end != last:
            changes[end] = changes.get(end, 0) - what["size"]
    value = 0
    c = built.counters
    for ns in sorted(changes):
        value += changes[ns]
        for k, v in (("rank", 0), ("track", device), ("name", "memory_allocated"),
                     ("ts_ns", ns - origin), ("value", float(value)), ("unit", "bytes")):  # fmt: skip
            c[k].append(v)


def _profiler_module(frames: Any) -> str | None:
    """The nn.Module path of a profiler's frames (innermost first) where it was recorded
    `with_modules=True`: its `nn.Module: NAME` frames, the outermost the root (""), as the
    Kineto importer names a trace's modules (pystacks.py)."""
    if not isinstance(frames, list):
        return None
    names = [f["name"][len(MODULE_PREFIX):] for f in reversed(frames) if isinstance(f, dict)
             and isinstance(f.get("name"), str) and f["name"].startswith(MODULE_PREFIX)]  # fmt: skip
    return ".".join(names[1:]) if names else None


def _stack(built: _Built, frames: Any) -> tuple[int | None, tuple, tuple]:
    """(stack id, innermost user frame, innermost model frame) of a snapshot's frames
    (innermost first); only Python frames are kept."""
    none = (None, None, None)
    if not isinstance(frames, list):
        return None, none, none
    kept = []
    for f in frames:
        if not isinstance(f, dict):
            continue
        file, line, name = f.get("filename"), f.get("line"), f.get("name")
        if not (isinstance(file, str) and file.endswith(".py")) and isinstance(name, str):
            named = _PROFILER_FRAME.fullmatch(name)  # a profiler's: "file.py(LINE): func"
            if named:
                file, line, name = named[1], int(named[2]), named[3]
        if isinstance(file, str) and file.endswith(".py") and type(line) is int:
            kept.append((file, line, str(name), scopes.scope_of(file)))
    if not kept:
        return None, none, none
    key = tuple(kept)
    sid = built.stack_ids.get(key)
    if sid is None:
        sid = built.stack_ids[key] = len(built.stack_ids)
        s = built.stacks
        for depth, (file, line, name, scope) in enumerate(kept):
            for k, v in (("stack_id", sid), ("depth", depth), ("file", file), ("line", line),
                         ("function", name), ("scope", scope)):  # fmt: skip
                s[k].append(v)
    user = next(((f, n, fn) for f, n, fn, s in kept if s == scopes.USER), none)
    model = next(((f, n, fn) for f, n, fn, s in kept if s in MODEL_SCOPES), none)
    return sid, user, model

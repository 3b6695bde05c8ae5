"""torch.profiler's trace with the neuron Kineto plugin's output in it, and without.

With `ProfilerActivity.PrivateUse1`, the plugin (backend/runtime/kineto_plugin.py) writes the
runtime's calls and device work into torch.profiler's own trace, on the real clock, and the
runtime's events themselves under one top-level key. Capture merges those records on the one
clock, so it reads the trace without the plugin's activities; and `neuron-explorer import` of
such a trace takes the events from that key and merges them the same way, giving the profile
that trace_handler would have written for the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

RUNTIME_KEY = "neuron_runtime"  # backend/runtime/events_codec.TRACE_KEY
PLUGIN_ARG = "neuron id"  # kineto_plugin.ID_ARG, in every activity's args
PLUGIN_FLOW = "ac2g"  # the launch -> kernel flows (a CPU-only trace has no others)
PLUGIN_SPANS = ("neuron (", "Iteration Start: neuron")  # Kineto's span of the plugin's buffer
MEMORY_EVENT, DEVICE_TYPE = "[memory]", "Device Type"  # a profile_memory=True sample, its device
PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1, the device's memory as the plugin reports it


def _device_memory(e: dict[str, Any]) -> bool:
    """A `[memory]` sample of the device (profile_memory=True): the runtime's memory records
    give the same counter on the one clock."""
    return e.get("name") == MEMORY_EVENT and (e.get("args") or {}).get(DEVICE_TYPE) == PRIVATEUSE1


def without_plugin_events(doc: dict[str, Any]) -> bool:
    """Take the plugin's activities, flows, device lanes, device memory samples and runtime
    key out of a decoded trace; True when it held any."""
    trace_events = doc.get("traceEvents") or []
    ours = [e for e in trace_events if PLUGIN_ARG in (e.get("args") or {})]
    if not ours and RUNTIME_KEY not in doc and not any(map(_device_memory, trace_events)):
        return False
    doc.pop(RUNTIME_KEY, None)
    device_pids = {e.get("pid") for e in ours if e.get("cat") != "privateuse1_runtime"}
    kept = []
    for e in trace_events:
        if PLUGIN_ARG in (e.get("args") or {}) or e.get("cat") == PLUGIN_FLOW:
            continue
        if _device_memory(e):
            continue
        if e.get("ph") == "M" and e.get("pid") in device_pids:
            continue
        if e.get("pid") in ("Spans", "Traces") and str(e.get("name", "")).startswith(PLUGIN_SPANS):
            continue
        kept.append(e)
    doc["traceEvents"] = kept
    return True


def drop_plugin_events(trace: Path) -> bool:
    """Rewrite `trace` (an uncompressed export_chrome_trace file) without the plugin's output;
    True when it held any."""
    text = trace.read_bytes()
    if not any(k in text for k in (PLUGIN_ARG.encode(), RUNTIME_KEY.encode(), b"[memory]")):
        return False
    doc = msgspec.json.decode(text)
    if without_plugin_events(doc):
        trace.write_bytes(msgspec.json.encode(doc))
    return True


def holds_runtime(path: Path) -> bool:
    """Whether a trace file holds the neuron runtime's events (cheap: its head only, where
    Kineto writes the top-level keys)."""
    import gzip
    import zlib

    try:
        with path.open("rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        opener: Any = gzip.open if gz else open
        with opener(path, "rb") as f:
            head = f.read(1 << 16)
    except (OSError, EOFError, zlib.error):  # a damaged file: the importer says what is wrong
        return False
    before_events = head.split(b'"traceEvents"', 1)[0]
    return f'"{RUNTIME_KEY}"'.encode() in before_events

"""The neuron Kineto plugin's activities taken out of torch.profiler's trace before the merge.

With `ProfilerActivity.PrivateUse1`, the plugin (backend/runtime/kineto_plugin.py) writes the
runtime's calls and device work into torch.profiler's own trace, on the real clock. Capture
merges the same records itself, on the one clock, so it reads the trace without them.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

PLUGIN_ARG = b'"neuron id"'  # kineto_plugin.ID_ARG, in every activity's args
PLUGIN_FLOW = "ac2g"  # the launch -> kernel flows (a CPU-only trace has no others)
PLUGIN_SPANS = ("neuron (", "Iteration Start: neuron")  # Kineto's span of the plugin's buffer


def drop_plugin_events(trace: Path) -> bool:
    """Rewrite `trace` (an uncompressed export_chrome_trace file) without the plugin's
    activities, flows and device lanes; True when it held any."""
    text = trace.read_bytes()
    if PLUGIN_ARG not in text:
        return False
    doc = msgspec.json.decode(text)
    device_pids = {
        e.get("pid")
        for e in doc.get("traceEvents", ())
        if e.get("ph") == "X" and "neuron id" in (e.get("args") or {})
        and e.get("cat") != "privateuse1_runtime"
    }  # fmt: skip
    kept = []
    for e in doc.get("traceEvents", ()):
        if "neuron id" in (e.get("args") or {}) or e.get("cat") == PLUGIN_FLOW:
            continue
        if e.get("pid") in ("Spans", "Traces") and str(e.get("name", "")).startswith(PLUGIN_SPANS):
            continue
        if e.get("ph") == "M" and e.get("pid") in device_pids:
            continue
        kept.append(e)
    doc["traceEvents"] = kept
    trace.write_bytes(msgspec.json.encode(doc))
    return True

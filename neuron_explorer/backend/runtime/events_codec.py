"""The runtime's events of one profile as text that travels inside a Kineto trace.

The Kineto plugin (kineto_plugin.py) writes them as one top-level key of torch.profiler's trace,
so that `neuron-explorer import` of that trace merges exactly what trace_handler would have
merged (capture/device_trace.py). Kineto rewrites every backslash of a metadata value and drops
newlines, so the JSON is compressed and base64-encoded: one plain string.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from neuron_explorer.backend.runtime.events import RuntimeEvent

TRACE_KEY = "neuron_runtime"  # the trace's top-level key
VERSION = 1
_FIELDS = tuple(f.name for f in dataclasses.fields(RuntimeEvent))


@dataclass(frozen=True)
class Recorded:
    """What trace_handler takes from the runtime for one profile, besides the trace."""

    events: tuple[RuntimeEvent, ...]
    device_spec: dict[str, Any] | None
    torch_version: str


def encode(events: Sequence[RuntimeEvent], device_spec: dict[str, Any] | None,
           torch_version: str) -> str:  # fmt: skip
    """The events (their stacks interned), the chip's spec and torch's version, as one base64
    string."""
    stack_ids: dict[tuple, int] = {}
    rows = []
    for e in events:
        row = [getattr(e, name) for name in _FIELDS]
        row[_FIELDS.index("stack")] = stack_ids.setdefault(e.stack, len(stack_ids))
        rows.append(row)
    doc = {"version": VERSION, "device_spec": device_spec, "torch_version": torch_version,
           "fields": _FIELDS, "stacks": list(stack_ids), "events": rows}  # fmt: skip
    text = json.dumps(doc, separators=(",", ":"), default=str).encode()
    return base64.b64encode(zlib.compress(text, 6)).decode("ascii")


def decode(text: str) -> Recorded:
    """What `encode` took, back; ValueError when the text is not one of ours."""
    try:
        doc = json.loads(zlib.decompress(base64.b64decode(text)))
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"not the neuron runtime's events ({exc})") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"neuron runtime events of version {doc.get('version')!r}, not {VERSION}")
    stacks = [tuple(tuple(frame) for frame in s) for s in doc["stacks"]]
    fields = doc["fields"]
    known = set(_FIELDS)
    out = []
    for row in doc["events"]:
        values = {k: v for k, v in zip(fields, row, strict=True) if k in known}
        values["stack"] = stacks[values["stack"]] if "stack" in values else ()
        values["shapes"] = tuple(tuple(s) for s in values.get("shapes", ()))
        values["dtypes"] = tuple(values.get("dtypes", ()))
        out.append(RuntimeEvent(**values))
    return Recorded(tuple(out), doc.get("device_spec"), str(doc.get("torch_version", "")))

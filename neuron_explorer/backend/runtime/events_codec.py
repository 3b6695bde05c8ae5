"""The runtime's events of one profile as text that travels inside a Kineto trace.

The Kineto plugin (kineto_plugin.py) writes them as one top-level key of torch.profiler's trace,
so that `neuron-explorer import` of that trace merges exactly what trace_handler would have
merged (capture/device_trace.py). Kineto rewrites every backslash of a metadata value and drops
newlines, so the JSON is compressed and base64-encoded: one plain string.
"""

from __future__ import annotations

import base64
import dataclasses
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from neuron_explorer.backend.runtime.events import RuntimeEvent

TRACE_KEY = "neuron_runtime"  # the trace's top-level key
VERSION = 1
_FIELDS = tuple(f.name for f in dataclasses.fields(RuntimeEvent))
assert not hasattr(RuntimeEvent, "__slots__")  # encode reads each event's __dict__


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
    at = _FIELDS.index("stack")
    for e in events:
        row = list(e.__dict__.values())  # the fields in declaration order, without a call each
        row[at] = stack_ids.setdefault(e.stack, len(stack_ids))
        rows.append(row)
    doc = {"version": VERSION, "device_spec": device_spec, "torch_version": torch_version,
           "fields": _FIELDS, "stacks": list(stack_ids), "events": rows}  # fmt: skip
    text = msgspec.json.encode(doc, enc_hook=str)
    return base64.b64encode(zlib.compress(text, 1)).decode("ascii")


def decode(text: str) -> Recorded:
    """What `encode` took, back; ValueError when the text is not one of ours."""
    try:
        doc = msgspec.json.decode(zlib.decompress(base64.b64decode(text)))
    except (ValueError, zlib.error, msgspec.DecodeError) as exc:
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

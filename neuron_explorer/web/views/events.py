"""The event view: neuron_explorer.analysis.events computes it; this adds the web's file ids
(a stack frame without a line, a builtin, links nowhere)."""

from __future__ import annotations

from typing import Any

from neuron_explorer.analysis.events import event_detail

from .source import with_file_ids


def event_json(con, event_id: int, events_file: str | None = None) -> dict[str, Any] | None:
    found = event_detail(con, event_id, events_file)
    if found is None:
        return None
    doc = found.to_dict()
    with_file_ids([doc["source"], doc["stack"]])
    for frame in doc["stack"]:
        if frame["line"] is None:
            frame["file_id"] = None
    return doc

"""The memory page's view: neuron_explorer.analysis.memory computes it; this adds the web's
file ids (each line at the peak links to the source view)."""

from __future__ import annotations

from typing import Any

from neuron_explorer.analysis import memory as _memory
from neuron_explorer.analysis.memory import counter_series  # noqa: F401 - the routes' name
from neuron_explorer.model import Profile

from .source import with_file_ids


def memory_json(profile: Profile, con) -> dict[str, Any]:
    doc = _memory.memory_page(profile, con).to_dict()
    if doc["peak"] is not None and "by_line" in doc["peak"]:  # a snapshot's peak charges none
        with_file_ids(doc["peak"]["by_line"])
    if doc.get("alive") is not None:
        with_file_ids(doc["alive"])
    return doc

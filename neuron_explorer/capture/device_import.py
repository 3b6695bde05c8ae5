"""`neuron-explorer import` of a trace that the neuron Kineto plugin wrote into: the profile
trace_handler would have written for the same run (device_trace.py says how)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ..errors import BadInputError, ExplorerError
from .device_trace import RUNTIME_KEY, without_plugin_events
from .handler import RawCapture, grouped_matmul_extra, write_profile


def import_device_trace(
    path: Path, out: Path, *, overwrite: bool = False, source_roots: Sequence[Path] = ()
) -> Path:
    """Write the profile of a trace that holds the neuron runtime's events (`holds_runtime`):
    the same merge as trace_handler's, of the same trace and events."""
    from ..importers.kineto_decode import read_bytes

    if out.exists() and not overwrite:
        raise ExplorerError(f"{out}: output path exists; choose another or remove it")
    try:
        doc = msgspec.json.decode(read_bytes(path))
    except msgspec.DecodeError as e:
        raise BadInputError(path, f"not valid JSON ({e})") from None
    from neuron_explorer.backend.runtime import events_codec  # torch: only for such a trace

    try:
        recorded = events_codec.decode(str(doc.get(RUNTIME_KEY, "")))
    except ValueError as e:
        raise BadInputError(path, str(e)) from None
    without_plugin_events(doc)
    workdir = Path(tempfile.mkdtemp(prefix="neuron-explorer-import-"))
    try:
        trace = workdir / "trace.json"
        trace.write_bytes(msgspec.json.encode(doc))
        roots = tuple(dict.fromkeys([os.getcwd(), str(path.parent.resolve()),
                                     *map(str, source_roots)]))  # fmt: skip
        raw = RawCapture(workdir, trace, recorded.events, recorded.device_spec, roots,
                         recorded.torch_version)  # fmt: skip
        extra = {"imported_from": path.name, **grouped_matmul_extra(recorded.events)}
        return write_profile(raw, out, extra)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

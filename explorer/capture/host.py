"""What capture does to torch.profiler's host events before the merge: remove the simulator's
own work, and find the steps of a run captured whole from its record_function markers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .link import inside_spans, reparent, step_of

SIMULATOR_DISPATCH = "PythonSubclass"  # the profiler's span for a tensor subclass dispatch


def column_array(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def column_list(table: pa.Table, name: str) -> list:
    col = table.column(name)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return col.to_pylist()


def drop_simulator_events(host: pa.Table, calls: Sequence[Any], origin_unix_ns: int) -> pa.Table:
    """Remove what the simulator itself did on the host: the CPU ops computing payloads inside
    runtime calls, and the PythonSubclass spans of the device tensor's __torch_dispatch__.
    Children of a removed event move to its nearest kept ancestor."""
    if not calls or not host.num_rows:
        return host
    track = np.array(column_list(host, "track"), dtype=object)
    start = column_array(host, "start_ns").astype(np.int64)
    end = start + column_array(host, "dur_ns").astype(np.int64)
    spans: dict[object, tuple] = {}
    for e in sorted(calls, key=lambda e: e.host_start_ns):
        s, t = spans.setdefault(f"thread {e.tid}", ([], []))
        s.append(e.host_start_ns - origin_unix_ns)
        t.append(e.host_end_ns - origin_unix_ns)
    spans = {k: (np.array(s, np.int64), np.array(t, np.int64)) for k, (s, t) in spans.items()}
    names = np.array(column_list(host, "name"), dtype=object)
    drop = inside_spans(track, start, end, spans) | (names == SIMULATOR_DISPATCH)
    drop &= np.array(column_list(host, "kind"), dtype=object) != "step"
    if not drop.any():
        return host
    ids = column_array(host, "id").astype(np.int64)
    raw_parent = host.column("parent_id").to_numpy(zero_copy_only=False)
    parents = np.where(np.isnan(raw_parent.astype(float)), -1, raw_parent).astype(np.int64)
    new_parent = reparent(ids, parents, ~drop)
    host = host.set_column(
        host.schema.get_field_index("parent_id"),
        "parent_id",
        pa.array(new_parent, pa.int64(), mask=new_parent < 0),
    )
    return host.filter(pa.array(~drop))


def steps_from_markers(host: pa.Table) -> pa.Table:
    """With at most one ProfilerStep (a run captured whole), the script's own repeated
    top-level `record_function` annotation, if any, marks the steps: its k-th span is step k.

    The most frequent top-level annotation name seen at least twice wins; the whole-run
    ProfilerStep becomes an annotation.
    """
    kinds = np.array(column_list(host, "kind"), dtype=object)
    is_step = kinds == "step"
    if is_step.sum() > 1 or not host.num_rows:
        return host
    raw_parent = host.column("parent_id").to_numpy(zero_copy_only=False).astype(float)
    ids = column_array(host, "id").astype(np.int64)
    top = np.isnan(raw_parent)
    if is_step.any():
        top = raw_parent == float(ids[is_step][0])
    names = np.array(column_list(host, "name"), dtype=object)
    cand = top & (kinds == "annotation")
    counts: dict[str, int] = {}
    for name in names[cand]:
        counts[name] = counts.get(name, 0) + 1
    best = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
    if best[1] < 2:
        return host
    marker = cand & (names == best[0])
    kinds[is_step] = "annotation"
    kinds[marker] = "step"
    start = column_array(host, "start_ns").astype(np.int64)
    end = start + column_array(host, "dur_ns").astype(np.int64)
    order = np.argsort(start[marker], kind="stable")
    m_start, m_end = start[marker][order], end[marker][order]
    number = np.full(len(kinds), -1, dtype=np.int64)
    number[np.flatnonzero(marker)[order]] = np.arange(marker.sum())
    step = step_of(start, m_start, m_end, np.arange(len(m_start)))
    step = np.where(marker, number, step)
    host = host.set_column(host.schema.get_field_index("kind"), "kind", pa.array(kinds.tolist()))
    return host.set_column(
        host.schema.get_field_index("step"), "step", pa.array(step, pa.int32(), mask=step < 0)
    )

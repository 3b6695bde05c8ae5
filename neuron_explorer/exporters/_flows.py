"""Flow pairing for trace exports. Events that share a `flow_id` on a rank are linked from the
flow's source (its host event, else its earliest event) to each of the others, except events
whose parent is in the same flow: a neuron kernel's instructions and DMA transfers carry its
launch's flow id, and one arrow to the kernel says it, where hundreds would hide the timeline.
The flow events are kept as a few integer columns while the events stream past, then paired
with one sort, so no Python object is made per event."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_COLUMNS = ("rank", "flow", "id", "parent", "start_ns", "host", "pid", "tid")
_NO_PARENT = -1  # event ids are never negative


@dataclass(frozen=True)
class FlowPairs:
    """One chunk of pairs: the target event's id, and each end's lane and start time."""

    id: np.ndarray
    src_pid: np.ndarray
    src_tid: np.ndarray
    src_start_ns: np.ndarray
    dst_pid: np.ndarray
    dst_tid: np.ndarray
    dst_start_ns: np.ndarray


class FlowCollector:
    """Collects the flow events of each batch (with the lanes the export gave them)."""

    def __init__(self) -> None:
        self._chunks: list[dict[str, np.ndarray]] = []

    def add(self, batch: pa.RecordBatch, pid: pa.Array, tid: pa.Array) -> None:
        linked = pc.is_valid(batch.column("flow_id"))
        if not pc.any(linked).as_py():
            return

        def take(arr: pa.Array) -> np.ndarray:
            return arr.filter(linked).to_numpy(zero_copy_only=False)

        layer = batch.column("layer").cast(pa.string())
        self._chunks.append(
            {
                "rank": take(batch.column("rank")),
                "flow": take(batch.column("flow_id")),
                "id": take(batch.column("id")),
                "parent": take(pc.fill_null(batch.column("parent_id"), _NO_PARENT)),
                "start_ns": take(batch.column("start_ns")),
                "host": take(pc.equal(layer, "host")),
                "pid": take(pc.cast(pid, pa.int64())),
                "tid": take(pc.cast(tid, pa.int64())),
            }
        )

    def pairs(self, chunk_rows: int) -> Iterator[FlowPairs]:
        """All pairs, `chunk_rows` at a time; the collected events are released first."""
        if not self._chunks:
            return
        cols = {k: np.concatenate([c[k] for c in self._chunks]) for k in _COLUMNS}
        self._chunks = []
        # sources first within a flow: host events, then the earliest, then the lowest id
        order = np.lexsort((cols["id"], cols["start_ns"], ~cols["host"], cols["flow"],
                            cols["rank"]))  # fmt: skip
        cols = {k: v[order] for k, v in cols.items()}
        n = len(order)
        first = np.ones(n, dtype=bool)
        first[1:] = (cols["rank"][1:] != cols["rank"][:-1]) | (
            cols["flow"][1:] != cols["flow"][:-1]
        )
        group_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        targets = np.flatnonzero(~first & ~_parent_in_same_flow(cols))
        sources = group_start[targets]
        for i in range(0, len(targets), chunk_rows):
            t, s = targets[i : i + chunk_rows], sources[i : i + chunk_rows]
            yield FlowPairs(
                id=cols["id"][t],
                src_pid=cols["pid"][s],
                src_tid=cols["tid"][s],
                src_start_ns=cols["start_ns"][s],
                dst_pid=cols["pid"][t],
                dst_tid=cols["tid"][t],
                dst_start_ns=cols["start_ns"][t],
            )


def _parent_in_same_flow(cols: dict[str, np.ndarray]) -> np.ndarray:
    """For each flow event: is its parent also an event of the same flow on the same rank?"""
    by_id = np.argsort(cols["id"], kind="stable")
    ids = cols["id"][by_id]
    at = np.searchsorted(ids, cols["parent"]).clip(0, max(len(ids) - 1, 0))
    parent = by_id[at]
    return (
        (cols["parent"] != _NO_PARENT)
        & (ids[at] == cols["parent"])
        & (cols["flow"][parent] == cols["flow"])
        & (cols["rank"][parent] == cols["rank"])
    )

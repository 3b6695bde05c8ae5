"""[memory] instant events -> the counters table's memory_allocated and memory_reserved
samples, one track per device.

Current traces give the totals (`Total Allocated`, `Total Reserved`). Old ones (torch < 1.10,
the TensorBoard plugin's samples) give only the change of each allocation or free (`Bytes`):
there memory_allocated is the running sum of the changes per device, in time order, so it
starts at the first sample's change (what was allocated before the trace began is unknown).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# c10::DeviceType values seen in [memory] events
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "cuda", 12: "xpu", 13: "mps", 20: "neuron"}


def memory_counters(mem: tuple[pa.ChunkedArray, ...], ts: np.ndarray) -> dict[str, Any]:
    """The samples' counters columns (`mem`: kineto_args' memory columns; `ts`: unix ns)."""
    alloc, reserved, dtype, did, nbytes = mem
    t = pc.fill_null(dtype, -1).to_numpy().astype(np.int64)
    i = pc.fill_null(did, -1).to_numpy().astype(np.int64)
    ut, ti = np.unique(t, return_inverse=True)
    ui, ii = np.unique(i, return_inverse=True)
    pairs, inverse = np.unique(ti.reshape(-1) * len(ui) + ii.reshape(-1), return_inverse=True)
    labels = [_device_label(int(ut[p // len(ui)]), int(ui[p % len(ui)])) for p in pairs]
    device = inverse.reshape(-1).astype(np.int64)
    alloc = _with_running_sums(alloc, nbytes, device, ts)
    parts: dict[str, list] = {"track": [], "name": [], "ts_ns": [], "value": []}
    for code, values in enumerate((alloc, reserved)):
        ok = pc.is_valid(values)
        ok_np = ok.to_numpy()
        parts["track"].append(device[ok_np])
        parts["name"].append(np.full(int(ok_np.sum()), code, np.int32))
        parts["ts_ns"].append(ts[ok_np])
        parts["value"].append(values.filter(ok).cast(pa.float64()).combine_chunks())
    # dictionaries: a sample's lane and name are codes, not a text each
    return {
        "track": _codes(np.concatenate(parts["track"]), pa.array(labels, pa.string())),
        "name": _codes(np.concatenate(parts["name"]), NAMES),
        "ts_ns": np.concatenate(parts["ts_ns"]),
        "value": pa.concat_arrays(parts["value"]),
    }


NAMES = pa.array(["memory_allocated", "memory_reserved"], pa.string())


def _codes(codes: np.ndarray, dictionary: pa.Array) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), dictionary)


def _with_running_sums(
    alloc: pa.ChunkedArray, nbytes: pa.ChunkedArray, device: np.ndarray, ts: np.ndarray
) -> pa.ChunkedArray:
    """`alloc`, where it is null and the sample has `Bytes` filled with the running sum of
    those changes per device in time order."""
    delta = pc.and_(pc.is_null(alloc), pc.is_valid(nbytes)).to_numpy(zero_copy_only=False)
    idx = np.flatnonzero(delta)
    if idx.size == 0:
        return alloc
    change = pc.fill_null(nbytes, 0).to_numpy().astype(np.int64)[idx]
    order = np.lexsort((ts[idx], device[idx]))  # by device, then time (stable)
    group, change = device[idx][order], change[order]
    total = np.cumsum(change)
    first = np.r_[True, group[1:] != group[:-1]]
    first_at = np.maximum.accumulate(np.where(first, np.arange(group.size), 0))
    running = total - (total - change)[first_at]  # the sum since the device's first sample
    values = pc.cast(alloc, pa.float64()).to_numpy(zero_copy_only=False).copy()
    values[idx[order]] = running
    valid = ~np.isnan(values)
    return pa.chunked_array([pa.array(np.where(valid, values, 0), pa.float64(), mask=~valid)])


def _device_label(dtype: int | None, index: int | None) -> str:
    kind = DEVICE_TYPES.get(dtype if dtype is not None else 0, f"device{dtype}")
    return kind if kind == "cpu" or index is None or index < 0 else f"{kind}:{index}"

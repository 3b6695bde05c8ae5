"""`torch.neuron.memory`: the device's memory API with torch.cuda.memory's names.

The figures are the device's own accounting (runtime/memory.py: bytes of the storages neuron
tensors hold). Nothing is cached (a payload's memory is freed when its last tensor goes), so
reserved equals allocated and `empty_cache()` has nothing to release. The history and snapshots
(`_record_memory_history`, `_snapshot`, `_dump_snapshot`) are torch.cuda's format
(runtime/memory_history.py), so `torch.cuda._memory_viz` and pytorch.org/memory_viz open them.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from typing import Any

import torch

from neuron_explorer.backend.runtime import memory as _accounting
from neuron_explorer.backend.runtime import memory_history as _history

Device = int | str | torch.device | None


def memory_allocated(device: Device = None) -> int:
    """Bytes held by live neuron tensors."""
    return _accounting.allocated()


def max_memory_allocated(device: Device = None) -> int:
    """Peak of memory_allocated() since start or the last reset_peak_memory_stats()."""
    return _accounting.peak()


def memory_reserved(device: Device = None) -> int:
    """Bytes the device holds for tensors: memory_allocated(), as nothing is cached."""
    return _accounting.allocated()


def max_memory_reserved(device: Device = None) -> int:
    return _accounting.peak()


def reset_peak_memory_stats(device: Device = None) -> None:
    _accounting.reset_peak()


def reset_max_memory_allocated(device: Device = None) -> None:
    _accounting.reset_peak()


def reset_max_memory_reserved(device: Device = None) -> None:
    _accounting.reset_peak()


def reset_accumulated_memory_stats(device: Device = None) -> None:
    """Nothing accumulates beyond the current and peak figures."""


def memory_stats(device: Device = None) -> OrderedDict[str, Any]:
    """torch.cuda.memory_stats()'s keys for the figures the device has."""
    now, peak = _accounting.allocated(), _accounting.peak()
    stats: OrderedDict[str, Any] = OrderedDict()
    for name in ("active_bytes", "allocated_bytes", "requested_bytes", "reserved_bytes"):
        stats[f"{name}.all.current"] = now
        stats[f"{name}.all.peak"] = peak
    stats["num_alloc_retries"] = 0
    stats["num_ooms"] = 0
    return stats


def memory_summary(device: Device = None, abbreviated: bool = False) -> str:
    """A short text of the figures (torch.cuda.memory_summary's name)."""
    now, peak = _accounting.allocated(), _accounting.peak()
    return f"neuron:0 memory: allocated {now} bytes, peak {peak} bytes (nothing cached)"


def mem_get_info(device: Device = None) -> tuple[int, int]:
    """(free, total) bytes: total is the modeled chip's HBM (runtime/model.py's spec)."""
    from neuron_explorer.backend.runtime import model

    total = int(model.spec().hbm_bytes)
    return max(0, total - _accounting.allocated()), total


def empty_cache() -> None:
    """Nothing is cached: payload memory is freed when the last tensor goes."""


def _record_memory_history(
    enabled: str | bool | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Device = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    """Record the stack of each allocation and a history of allocations and frees, as
    torch.cuda.memory._record_memory_history (enabled: "all", "state" or None to stop)."""
    _history.record(enabled, context, stacks, max_entries, clear_history)


def _snapshot(device: Device = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """The device's memory now, in torch.cuda.memory._snapshot()'s format."""
    return _history.snapshot()


def _dump_snapshot(filename: str = "dump_snapshot.pickle",
                   augment_with_fx_traces: bool = False) -> None:  # fmt: skip
    """Pickle _snapshot() to `filename` (open it at pytorch.org/memory_viz, or import it with
    `neuron-explorer import`)."""
    _history.dump(filename)


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict[str, Any]]:
    """The segments of _snapshot(), as torch.cuda.memory_snapshot."""
    return _history.snapshot()["segments"]

"""The device's memory history and snapshots, in the format of `torch.cuda.memory._snapshot()`.

`torch.neuron.memory._record_memory_history()` turns recording on: each storage the device
counts (runtime/memory.py) keeps the Python stack that allocated it, and each allocation and
free becomes a trace entry (`alloc`, then `free_requested` and `free_completed`). The device has
no caching allocator (a payload's memory is freed when its last tensor goes), so each storage
is a segment of its own holding one block, as CUDA's allocator with caching off reports it:
`segment_alloc` before each `alloc`, `segment_free` after each `free_completed`. A snapshot
therefore holds every live storage as one `active_allocated` block, and torch's own
`torch.cuda._memory_viz` reads it (`segsum`, `trace`, `segments`, `memory`, `trace_plot`,
`segment_plot`).

Frames are Python frames only (no C++), innermost first, as CUDA's: our own package's frames
are left out (runtime/source.py). A storage allocated in backward, on autograd's device thread,
has no Python frames of its own: it gets the autograd node's name as its innermost frame and
then the stack of the forward op that made the node. Each block and entry also carries
`module`, the nn.Module path of the innermost module whose forward ran (a key CUDA's snapshots
do not have; PyTorch's visualizer ignores it).
"""

from __future__ import annotations

import collections
import pickle
import sys
import threading
import time
from typing import Any

import torch

from neuron_explorer.backend.runtime import memory, source

_current_node = torch._C._current_autograd_node
_sequence_nr = torch._C._autograd._get_sequence_nr
_grad_enabled = torch.is_grad_enabled

ENABLED = ("state", "all")
CONTEXTS = ("state", "alloc", "all")
STACKS = ("python", "all")  # "all" adds C++ frames on CUDA; the device has only Python frames
FORWARD_SITES_KEPT = 100_000  # forward ops whose stacks backward allocations can still find

_lock = threading.Lock()
_on = False
_trace_on = False  # enabled="all": keep the history of actions, not only live blocks' stacks
_context: str | None = None
_trace: collections.deque = collections.deque()
# id(storage) -> (address, size, frames, module) of each storage allocated while recording
_blocks: dict[int, tuple[int, int, list, str | None]] = {}
_frames_of: dict[int, list] = {}  # stack id -> its frames as snapshot dicts (shared, not copied)
_forward_site: dict[int, tuple[int, str | None]] = {}  # autograd sequence number -> call site


def record(
    enabled: str | bool | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    clear_history: bool = False,
) -> None:
    """Start (`enabled` "state" or "all") or stop (None) recording, as torch.cuda's
    `_record_memory_history`; True and False are its legacy spellings of "all" and None."""
    global _on, _trace_on, _context, _trace
    if enabled is True:
        enabled = "all"
    elif enabled is False:
        enabled = None
    if enabled not in (None, *ENABLED):
        raise ValueError(f"enabled must be one of None, 'state', 'all', not {enabled!r}")
    if context not in (None, *CONTEXTS):
        raise ValueError(f"context must be one of None, 'state', 'alloc', 'all', not {context!r}")
    if stacks not in STACKS:
        raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
    if int(max_entries) <= 0:
        raise ValueError(f"max_entries must be positive, not {max_entries}")
    with _lock:
        if clear_history:
            _trace.clear()
        if enabled is None:
            _on = _trace_on = False
            memory.ON_ALLOC = memory.ON_FREE = None
            return
        keep = list(_trace)[-int(max_entries) :] if _trace else []
        _trace = collections.deque(keep, maxlen=int(max_entries))
        _on, _trace_on, _context = True, enabled == "all", context
        memory.ON_ALLOC, memory.ON_FREE = _allocated, _freed


def _site() -> tuple[list, str | None]:
    """(frames, module) of the allocation being made now."""
    node = _current_node()
    if node is not None:  # backward: the node's name, then its forward op's stack
        sid, module = _forward_site.get(node._sequence_nr(), (-1, None))
        return [{"filename": "<autograd>", "line": 0, "name": node.name()}, *_frames(sid)], module
    sid, module = source.call_site(3)
    if _grad_enabled():  # the op's autograd node (if it made one) is the newest
        seq = _sequence_nr() - 1
        if seq >= 0 and seq not in _forward_site:
            if len(_forward_site) > 2 * FORWARD_SITES_KEPT:
                # list(dict) is one step under the GIL: autograd's thread may insert meanwhile
                for old in [k for k in list(_forward_site) if k < seq - FORWARD_SITES_KEPT]:
                    _forward_site.pop(old, None)
            _forward_site[seq] = (sid, module)
    return _frames(sid), module


def _frames(sid: int) -> list:
    if sid < 0:
        return []
    frames = _frames_of.get(sid)
    if frames is None:
        frames = _frames_of[sid] = [
            {"filename": f, "line": n, "name": fn} for f, n, fn, _scope in source.STACKS[sid]
        ]
    return frames


def _entry(action: str, addr: int, size: int, frames: list, module: str | None) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0,
            "time_us": time.time_ns() // 1000, "frames": frames, "module": module,
            "compile_context": "N/A", "user_metadata": ""}  # fmt: skip


def _allocated(key: int, storage: Any, nbytes: int) -> None:
    """memory.py counted a new storage (or one resized up): keep its stack, trace it."""
    frames, module = _site() if _context is not None else ([], None)
    addr = storage.data_ptr()
    with _lock:
        _blocks[key] = (addr, nbytes, frames, module)
        if _trace_on:
            traced = frames if _context in ("alloc", "all") else []
            _trace.append(_entry("segment_alloc", addr, nbytes, traced, module))
            _trace.append(_entry("alloc", addr, nbytes, traced, module))


def _freed(key: int, nbytes: int) -> None:
    """The storage counted under `key` is gone (or resized down by `nbytes`)."""
    with _lock:
        block = _blocks.pop(key, None)
        if not _trace_on:
            return
        addr, module = (block[0], block[3]) if block is not None else (key, None)
    frames: list = []
    if _context == "all":
        frames, _ = _site()
    with _lock:
        for action in ("free_requested", "free_completed", "segment_free"):
            _trace.append(_entry(action, addr, nbytes, frames, module))


def snapshot() -> dict[str, Any]:
    """The device's memory now, as `torch.cuda.memory._snapshot()` gives CUDA's: one segment
    per live storage, holding one active block with the stack that allocated it (empty for a
    storage allocated while nothing recorded), and the recorded history."""
    segments = []
    for key, size, addr in memory.live_storages():
        known = _blocks.get(key)
        frames, module = (
            (known[2], known[3]) if known is not None and known[0] == addr else ([], None)
        )
        if _context is None:
            frames = []
        block = {"address": addr, "size": size, "requested_size": size,
                 "state": "active_allocated", "frames": frames, "module": module}  # fmt: skip
        segments.append({
            "device": 0, "address": addr, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": 0,
            "segment_type": "large" if size > LARGE_SEGMENT else "small",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
            "blocks": [block],
        })  # fmt: skip
    segments.sort(key=lambda s: s["address"])
    with _lock:
        trace = list(_trace)
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {},
            "device_type": "neuron"}  # fmt: skip


LARGE_SEGMENT = 1 << 20  # CUDA's allocator calls a segment over 1 MiB "large"


def dump(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle `snapshot()` to `filename`, as torch.cuda.memory._dump_snapshot."""
    data = snapshot()
    with open(filename, "wb") as f:
        pickle.dump(data, f)

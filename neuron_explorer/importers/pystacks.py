"""Python call stacks from torch.profiler's `python_function` events (with_stack=True).

Each python event is one frame; its enclosing python event is the caller. Identical frame chains
share one stack_id. The innermost frame outside torch, site-packages and the standard library
is the event's source line (src_file, src_line, src_func).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from .nesting import NONE

# "path/to/file.py(123): func" as written by torch.profiler
_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.*)$")
BUILTIN_FILE = "<built-in>"
MAX_SOURCE_BYTES = 1 << 20

# Top-level packages whose frames are never the user's line.
LIBRARY_ROOTS = frozenset(
    {
        "torch", "torchvision", "torchaudio", "torchtext", "functorch", "triton", "numpy",
        "transformers", "accelerate", "datasets", "tokenizers", "deepspeed", "apex", "fairscale",
        "lightning", "pytorch_lightning", "timm", "tqdm", "typing_extensions",
        "neuron_explorer", "importlib", "_pytest", "pytest", "pluggy",
    }
)  # fmt: skip
_LIB_MARKERS = ("site-packages/", "dist-packages/", "/lib/python3", "/torch/")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int | None
    func: str


def parse_frame(name: str) -> Frame:
    m = _FRAME.match(name)
    if m is None:
        return Frame(BUILTIN_FILE, None, name)
    return Frame(m["file"], int(m["line"]), m["func"])


def is_user_file(file: str) -> bool:
    """True for a file the user wrote: not torch, not an installed package, not the stdlib."""
    if file.startswith("<"):
        return False
    norm = file.replace("\\", "/")
    if any(m in norm for m in _LIB_MARKERS):
        return False
    root = norm.lstrip("/").split("/", 1)[0]
    root = root[:-3] if root.endswith(".py") else root
    return root not in LIBRARY_ROOTS and root not in sys.stdlib_module_names


@dataclass(frozen=True)
class Stacks:
    """Per event: stack_id (or -1) and the index of its innermost user frame in `frames`."""

    stack_id: np.ndarray  # int64 per event
    user_frame: np.ndarray  # int64 per event, index into frames, -1 when none
    frames: tuple[Frame, ...]  # distinct frames
    table: dict[str, pa.Array]  # the stacks table


def build(
    is_python: np.ndarray, py_parent: np.ndarray, name_code: np.ndarray, names: list[str]
) -> Stacks:
    """Stacks for all events of a trace.

    `is_python` marks python events, `py_parent` is each event's nearest enclosing python event
    (-1 at the top), `name_code` indexes `names`. Algorithm: level by level from the outermost
    frame, a stack is the pair (caller's stack, frame), numbered with np.unique, so identical
    chains get one id with no per-event Python.
    """
    n = len(is_python)
    frames = tuple(parse_frame(s) for s in names)
    user = np.array([is_user_file(f.file) for f in frames], dtype=bool)
    py_idx = np.flatnonzero(is_python)
    own_sid = np.full(n, NONE, dtype=np.int64)
    stack_parent: list[np.ndarray] = []
    stack_frame: list[np.ndarray] = []
    next_id = 0
    # python depth of each python event, by walking up the python parents (few levels)
    level = np.zeros(n, dtype=np.int64)
    cur = py_parent[py_idx]
    while True:
        up = cur >= 0
        if not up.any():
            break
        level[py_idx[up]] += 1
        cur = np.where(up, py_parent[np.clip(cur, 0, None)], NONE)
    for d in range(int(level[py_idx].max()) + 1 if py_idx.size else 0):
        members = py_idx[level[py_idx] == d]
        psid = np.where(py_parent[members] >= 0, own_sid[np.clip(py_parent[members], 0, None)], -1)
        key = (psid + 1) * len(names) + name_code[members]
        uniq, inverse = np.unique(key, return_inverse=True)
        own_sid[members] = inverse + next_id
        stack_parent.append(uniq // len(names) - 1)
        stack_frame.append(uniq % len(names))
        next_id += len(uniq)
    s_parent = np.concatenate(stack_parent) if stack_parent else np.zeros(0, np.int64)
    s_frame = np.concatenate(stack_frame) if stack_frame else np.zeros(0, np.int64)
    # innermost user frame per stack (parents have lower ids, so one pass per level suffices)
    s_user = np.where(user[s_frame], s_frame, NONE) if len(s_frame) else s_frame
    for _ in range(len(stack_parent)):
        need = (s_user < 0) & (s_parent >= 0)
        if not need.any():
            break
        s_user = np.where(need, s_user[np.clip(s_parent, 0, None)], s_user)
    sid = np.where(is_python, own_sid, np.where(py_parent >= 0, own_sid[py_parent], NONE))
    ev_user = np.where(sid >= 0, s_user[np.clip(sid, 0, None)] if len(s_user) else NONE, NONE)
    return Stacks(sid, ev_user, frames, _table(s_parent, s_frame, frames))


def _table(s_parent: np.ndarray, s_frame: np.ndarray, frames: tuple[Frame, ...]) -> dict:
    """One row per (stack, depth): walk every stack up to its outermost frame at once."""
    sids, depths, fidx = [np.zeros(0, np.int64)], [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
    sid = np.arange(len(s_parent), dtype=np.int64)
    cur = sid.copy()
    depth = 0
    while cur.size:
        sids.append(sid)
        depths.append(np.full(len(cur), depth, dtype=np.int32))
        fidx.append(s_frame[cur])
        nxt = s_parent[cur]
        keep = nxt >= 0
        sid, cur = sid[keep], nxt[keep]
        depth += 1
    all_sid: np.ndarray = np.concatenate(sids)
    all_depth: np.ndarray = np.concatenate(depths)
    all_f: np.ndarray = np.concatenate(fidx)
    order = np.lexsort((all_depth, all_sid))
    take = pa.array(all_f[order])
    return {
        "stack_id": pa.array(all_sid[order]),
        "depth": pa.array(all_depth[order]),
        "file": pa.array([f.file for f in frames], pa.string()).take(take),
        "line": pa.array([f.line for f in frames], pa.int32()).take(take),
        "function": pa.array([f.func for f in frames], pa.string()).take(take),
    }


def find_source(file: str, roots: list[Path]) -> Path | None:
    """The file on disk for a frame's path (absolute, or relative to one of `roots`)."""
    p = Path(file)
    candidates = [p] if p.is_absolute() else [r / p for r in roots]
    for c in candidates:
        try:
            if c.is_file() and c.stat().st_size <= MAX_SOURCE_BYTES:
                return c
        except OSError:
            continue
    return None

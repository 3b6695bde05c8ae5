"""Python call stacks from torch.profiler's `python_function` events (with_stack=True).

Each python event is one frame; its enclosing python event is the caller. Identical frame chains
share one stack_id. The innermost frame outside torch, site-packages and the standard library
is the event's source line (src_file, src_line, src_func); the innermost frame outside torch and
the standard library is its model line (model_file, ...). With with_modules=True the trace has
an `nn.Module: Class_N` frame per module call: their chain below the outermost one is the
event's module path (`GPT2Model_0.GPT2Block_1.GPT2Attention_1`; a trace holds no attribute
names, so torch.profiler's instance names stand for them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ..vocab import frames as vocab_frames
from ..vocab.intervals import NONE, nearest
from .kineto_frames import compact

# "path/to/file.py(123): func" as written by torch.profiler
_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<func>.*)$")
BUILTIN_FILE = "<built-in>"

MODULE_PREFIX = "nn.Module: "


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


def scope_of(file: str, func: str = "") -> str:
    """Whose code a trace frame is: the vocabulary's scope of its path (vocab/frames.py: user,
    library, torch, stdlib, own), or builtin, or module (an `nn.Module: X` frame of
    with_modules). torch.profiler's own frames are torch's here: a trace shows them."""
    if file == BUILTIN_FILE:
        return "module" if func.startswith(MODULE_PREFIX) else "builtin"
    scope = vocab_frames.scope_of(file)
    return vocab_frames.TORCH if scope == vocab_frames.PROFILER else scope


@dataclass(frozen=True)
class Stacks:
    """Per event: stack_id (or -1) and the index of its innermost user frame in `frames`,
    its innermost model frame, and its module path (index into `modules`)."""

    stack_id: np.ndarray  # per event (int32 below 2**31 stacks)
    user_frame: np.ndarray  # per event, index into frames (narrowest int type), -1 when none
    frames: tuple[Frame, ...]  # distinct frames
    table: dict[str, pa.Array]  # the stacks table
    model_frame: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # as user_frame
    module: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # into modules, -1
    modules: tuple[str, ...] = ()

    def inherit_backward(
        self, flow_src: np.ndarray, is_op: np.ndarray, parent: np.ndarray,
        dev_rows: np.ndarray, launch: np.ndarray,
    ) -> Stacks:  # fmt: skip
        """Backward ops (the targets of fwdbwd flows from a forward op) take the forward op's
        stack, lines and module, and so does everything nested in them and the device work
        they launched: a backward kernel belongs where its forward op was called (in place, as
        take_launch)."""
        if len(self.module) != len(self.stack_id):
            return self
        src = np.where(is_op & (flow_src >= 0), flow_src, NONE)
        src = np.where((src >= 0) & is_op[np.clip(src, 0, None)] & (src != np.arange(len(src))),
                       src, NONE)  # fmt: skip
        bwd = src >= 0
        if not bwd.any():
            return self
        anc = nearest(parent, bwd, include_self=True)
        take = np.flatnonzero(anc >= 0)
        fwd = src[anc[take]]
        for a in (self.stack_id, self.user_frame, self.model_frame, self.module):
            a[take] = a[fwd]  # in place: each a column the size of the trace
        return self.take_launch(dev_rows, launch) if len(dev_rows) else self

    def take_launch(self, rows: np.ndarray, launch: np.ndarray) -> Stacks:
        """Device work takes its launch's stack, lines and module (the columns are changed in
        place: build made them for this Stacks alone)."""
        for a in (self.stack_id, self.user_frame, self.model_frame, self.module):
            a[rows] = a[launch]
        return self


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
    scopes = [scope_of(f.file, f.func) for f in frames]
    user = np.array([sc == "user" for sc in scopes], dtype=bool)
    model = np.array([sc in ("user", "library") for sc in scopes], dtype=bool)
    py_idx = np.flatnonzero(is_python)
    index = np.int32 if n < 2**31 else np.int64  # stack ids: fewer than the events
    own_sid = np.full(n + 1, NONE, dtype=index)  # the last slot: what parent -1 reads
    stack_parent: list[np.ndarray] = []
    stack_frame: list[np.ndarray] = []
    next_id = 0
    # python depth of each python event, by walking up the python parents (few levels)
    level = np.zeros(py_idx.size, dtype=np.int32)  # per python event, not per event
    cur = py_parent[py_idx]
    while True:
        up = cur >= 0
        if not up.any():
            break
        level[up] += 1
        cur = np.where(up, py_parent[np.clip(cur, 0, None)], NONE)
    for d in range(int(level.max()) + 1 if py_idx.size else 0):
        members = py_idx[level == d]
        up_sid = own_sid[np.clip(py_parent[members], 0, None)].astype(np.int64)  # key: int64
        psid = np.where(py_parent[members] >= 0, up_sid, -1)
        key = (psid + 1) * len(names) + name_code[members]
        uniq, inverse = np.unique(key, return_inverse=True)
        own_sid[members] = inverse + next_id
        stack_parent.append(uniq // len(names) - 1)
        stack_frame.append(uniq % len(names))
        next_id += len(uniq)
    s_parent = np.concatenate(stack_parent) if stack_parent else np.zeros(0, np.int64)
    s_frame = np.concatenate(stack_frame) if stack_frame else np.zeros(0, np.int64)
    # innermost user frame per stack (parents have lower ids, so one pass per level suffices)
    s_user = _innermost(user, s_parent, s_frame, len(stack_parent))
    s_model = _innermost(model, s_parent, s_frame, len(stack_parent))
    s_module, modules = _module_paths(frames, s_parent, s_frame)
    sid = own_sid[py_parent]  # parent -1 reads NONE
    sid[py_idx] = own_sid[py_idx]
    del own_sid, level
    codes = np.int32 if next_id < 2**31 and len(frames) < 2**31 else np.int64
    sid = sid.astype(codes, copy=False)

    def per_event(per_stack: np.ndarray) -> np.ndarray:
        """Per event, its stack's value, in the narrowest codes that hold the values (a column
        the size of the trace each)."""
        if not len(per_stack):
            return np.full(n, NONE, dtype=np.int8)
        return compact(np.append(per_stack, NONE))[sid]

    table = _table(s_parent, s_frame, frames)
    table["scope"] = pa.array(scopes, pa.string()).take(pa.array(_frame_index(table, s_frame)))
    return Stacks(sid, per_event(s_user), frames, table, per_event(s_model),
                  per_event(s_module), modules)  # fmt: skip


def _innermost(
    wanted: np.ndarray, s_parent: np.ndarray, s_frame: np.ndarray, levels: int
) -> np.ndarray:
    """Per stack, its innermost frame with `wanted` (parents have lower ids, so one pass per
    level suffices)."""
    out = np.where(wanted[s_frame], s_frame, NONE) if len(s_frame) else s_frame
    for _ in range(levels):
        need = (out < 0) & (s_parent >= 0)
        if not need.any():
            break
        out = np.where(need, out[np.clip(s_parent, 0, None)], out)
    return out


def _module_paths(
    frames: tuple[Frame, ...], s_parent: np.ndarray, s_frame: np.ndarray
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Per stack, the index of its module path in the returned paths (-1: no module frame)."""
    is_mod = np.array([f.func.startswith(MODULE_PREFIX) for f in frames], dtype=bool)
    out = np.full(len(s_frame), NONE, dtype=np.int64)
    if not len(s_frame) or not is_mod[s_frame].any():
        return out, ()
    paths: dict[str, int] = {}
    path_of: list[str | None] = [None] * len(s_frame)
    for i, (p, f) in enumerate(zip(s_parent.tolist(), s_frame.tolist(), strict=True)):
        up = path_of[p] if p >= 0 else None
        if is_mod[f]:
            name = frames[f].func[len(MODULE_PREFIX) :]
            up = "" if up is None else (f"{up}.{name}" if up else name)  # the outermost is ""
        path_of[i] = up
        if up is not None:
            out[i] = paths.setdefault(up, len(paths))
    return out, tuple(paths)


def _frame_index(table: dict, s_frame: np.ndarray) -> np.ndarray:
    """The frame index of each stacks-table row (rows are (stack, depth) in order)."""
    index = table.pop("_frame").to_numpy()
    return index if len(s_frame) else np.zeros(0, np.int64)


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
        "_frame": take,
        "stack_id": pa.array(all_sid[order]),
        "depth": pa.array(all_depth[order]),
        "file": pa.array([f.file for f in frames], pa.string()).take(take),
        "line": pa.array([f.line for f in frames], pa.int32()).take(take),
        "function": pa.array([f.func for f in frames], pa.string()).take(take),
    }

"""What capture does to torch.profiler's host events before the merge: remove the simulator's
own work, and find the steps of a run captured whole from its record_function markers."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

from ..importers.pystacks import BUILTIN_FILE, parse_frame
from ..vocab.frames import is_own_file, is_user_file
from ..vocab.intervals import inside_spans, step_of

SIMULATOR_DISPATCH = "PythonSubclass"  # the profiler's span for a tensor subclass dispatch
OPTIMIZER_SPAN = "Optimizer.step#"  # torch.optim's record_function around step()
STOP_MARKER = "Record Window End"  # Kineto's instant at the end of a recording


def column_array(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def column_list(table: pa.Table, name: str) -> list:
    col = table.column(name)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    return col.to_pylist()


def drop_simulator_events(host: pa.Table, calls: Sequence[Any], origin_unix_ns: int) -> pa.Table:
    """Remove what the simulator itself did on the host: the CPU ops computing payloads inside
    runtime calls, and the PythonSubclass spans of the device tensor's __torch_dispatch__, each
    with everything nested in it."""
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
    drop |= _host_library_collectives(names, start, end, calls, origin_unix_ns)
    drop &= np.array(column_list(host, "kind"), dtype=object) != "step"
    return host.filter(pa.array(~with_descendants(host, drop)))


def _host_library_collectives(
    names: np.ndarray, start: np.ndarray, end: np.ndarray, calls: Sequence[Any], origin: int
) -> np.ndarray:
    """gloo's own spans (on its worker threads) inside a neuron collective's runtime call: the
    host library moving the payloads, which the runtime models as the collective itself."""
    spans = sorted(
        (e.host_start_ns - origin, e.host_end_ns - origin)
        for e in calls
        if e.kind == "runtime" and e.name.startswith(("c10d::", "_c10d_functional::"))
    )
    gloo = np.array([isinstance(n, str) and n.startswith("gloo:") for n in names], dtype=bool)
    if not spans or not gloo.any():
        return np.zeros(len(names), dtype=bool)
    lo = np.array([s for s, _ in spans], dtype=np.int64)
    hi = np.maximum.accumulate(np.array([t for _, t in spans], dtype=np.int64))
    i = np.searchsorted(lo, start, side="right") - 1
    return gloo & (i >= 0) & (end <= hi[np.maximum(i, 0)])


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


def without_stop_marker(host: pa.Table) -> pa.Table:
    """Drop Kineto's "Record Window End" instant: it marks when the profiler finished stopping,
    after its own processing of the last step, not work; a timeline drawn to it is mostly
    empty."""
    if not host.num_rows:
        return host
    names = np.array(column_list(host, "name"), dtype=object)
    return host.filter(pa.array(names != STOP_MARKER))


def close_optimizer_spans(host: pa.Table) -> pa.Table:
    """End each `Optimizer.step#...` span with its last direct child.

    torch.optim records the span around its post-hooks, and capture's step marker is such a
    hook (runner.py): its `prof.step()` runs inside the span, so the span outlives the update
    into the next step, and after the last active step the profiler stops inside it and Kineto
    ends it with the recording. The update itself is the span's children (the step markers
    opened from the hook aside); a span with none ends with its own step."""
    if not host.num_rows:
        return host
    names = np.array(column_list(host, "name"), dtype=object)
    is_opt = np.array([isinstance(n, str) and n.startswith(OPTIMIZER_SPAN) for n in names])
    if not is_opt.any():
        return host
    ids = column_array(host, "id").astype(np.int64)
    raw = host.column("parent_id").to_numpy(zero_copy_only=False).astype(float)
    parents = np.where(np.isnan(raw), -1, raw).astype(np.int64)
    start = column_array(host, "start_ns").astype(np.int64)
    end = start + column_array(host, "dur_ns").astype(np.int64)
    child = np.isin(parents, ids[is_opt]) & (np.array(column_list(host, "kind")) != "step")
    last: dict[int, int] = {}
    for p, e in zip(parents[child].tolist(), end[child].tolist(), strict=True):
        last[p] = max(last.get(p, e), e)
    is_step = np.array(column_list(host, "kind")) == "step"
    step_s, step_e = start[is_step], end[is_step]
    dur = end - start
    for i in np.flatnonzero(is_opt).tolist():
        s, e = int(start[i]), int(end[i])
        if int(ids[i]) in last:
            e = min(e, last[int(ids[i])])
        else:  # no op recorded in it: it ends with its step, which the hook's marker ended
            e = min([e, *step_e[(step_s <= s) & (step_e > s)].tolist()])
        dur[i] = e - s
    return host.set_column(host.schema.get_field_index("dur_ns"), "dur_ns", pa.array(dur))


def without_own_frames(events: pa.Table, stacks: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Stacks lose the backend's and explorer's frames; an event whose innermost user frame
    was one of them takes the next user frame of its stack instead (or none)."""
    if not stacks.num_rows:
        return events, stacks
    files = column_list(stacks, "file")
    own = np.array([is_own_file(f) for f in files], dtype=bool)
    if not own.any() and not any(is_own_file(f) for f in column_list(events, "src_file")):
        return events, stacks
    sid = column_array(stacks, "stack_id").astype(np.int64)
    depth = column_array(stacks, "depth").astype(np.int64)
    kept = stacks.filter(pa.array(~own))
    k_sid, k_depth = sid[~own], depth[~own]
    order = np.lexsort((k_depth, k_sid))
    new_depth = np.empty(len(k_sid), dtype=np.int64)
    first = np.r_[True, k_sid[order][1:] != k_sid[order][:-1]] if len(order) else np.zeros(0, bool)
    starts = (
        np.maximum.accumulate(np.where(first, np.arange(len(order)), 0)) if len(order) else first
    )
    new_depth[order] = np.arange(len(order)) - starts
    kept = kept.set_column(
        kept.schema.get_field_index("depth"), "depth", pa.array(new_depth, pa.int32())
    )
    # Innermost remaining user frame per stack.
    lines, funcs = column_list(kept, "line"), column_list(kept, "function")
    kfiles = column_list(kept, "file")
    user: dict[int, tuple] = {}
    for i in order.tolist():
        s = int(k_sid[i])
        if s not in user and is_user_file(kfiles[i]):
            user[s] = (kfiles[i], lines[i], funcs[i])
    src = [column_list(events, c) for c in ("src_file", "src_line", "src_func")]
    stack_ids = column_list(events, "stack_id")
    for i, f in enumerate(src[0]):
        if is_own_file(f):
            frame = user.get(stack_ids[i]) if stack_ids[i] is not None else None
            src[0][i], src[1][i], src[2][i] = frame or (None, None, None)
    for name, values, ty in zip(("src_file", "src_line", "src_func"), src,
                                (pa.string(), pa.int32(), pa.string()), strict=True):  # fmt: skip
        events = events.set_column(events.schema.get_field_index(name), name, pa.array(values, ty))
    return events, kept


def python_files_named_now(host: pa.Table) -> pa.Table:
    """Python events' files named as torch.profiler names them in a fresh process: relative to
    the first prefix of `sys.path` (and site's) as it is now. torch computes those prefixes
    once, at the process's first `with_stack` recording (a static of its python tracer), so a
    later recording in the same process after `sys.path` changed (`capture`'s runner puts the
    script's directory first) names the script's files by a stale prefix ("code/script.py"
    for "script.py"), and which files are the user's would depend on what ran before."""
    if not host.num_rows or not pa.compute.any(pa.compute.equal(host["kind"], "python")).as_py():
        return host
    from torch.profiler.python_tracer import _prefix_regex

    prefixes = tuple(_prefix_regex())
    kinds, names = column_list(host, "kind"), column_list(host, "name")
    renamed = [_named_now(n, prefixes) if k == "python" else n
               for k, n in zip(kinds, names, strict=True)]  # fmt: skip
    if renamed == names:
        return host
    return host.set_column(host.schema.get_field_index("name"), "name", pa.array(renamed))


@functools.lru_cache(maxsize=65536)
def _named_now(name: str, prefixes: tuple[str, ...]) -> str:
    frame = parse_frame(name)
    file = frame.file
    if file == BUILTIN_FILE:
        return name
    full = file if os.path.isabs(file) else next(
        (p + file for p in prefixes if os.path.isfile(p + file)), None
    )  # fmt: skip
    if full is None:
        return name
    trimmed = next((full[len(p) :] for p in prefixes if full.startswith(p)), full)
    return f"{trimmed}({frame.line}): {frame.func}"


def drop_own_frames(host: pa.Table) -> pa.Table:
    """Remove the python events of the backend's and explorer's own functions, with everything
    they called (builtins, torch internals): that is the simulator at work, not the user.

    An own frame the user's code ran inside (`neuron-explorer capture`'s runner, the CLI above
    it) goes alone: what it ran apart from the user's code goes with it, and the user's frames,
    the ProfilerStep spans and ops inside them stay, nested in the nearest event kept."""
    if not host.num_rows:
        return host
    kinds = np.array(column_list(host, "kind"), dtype=object)
    python = kinds == "python"
    names = column_list(host, "name")
    own = python & np.array([_is_own_python_event(n) for n in names])
    if not own.any():
        return host
    user = python & np.array(
        [bool(p) and _is_user_python_event(n) for p, n in zip(python, names, strict=True)]
    )
    tree = _Tree(host)
    holds_user = tree.any_descendant(user)
    wrapper = own & holds_user
    drop = own & ~wrapper
    drop |= tree.child_of(wrapper) & ~holds_user & ~user & ~wrapper  # the runner's own work
    drop = with_descendants(host, drop) | wrapper
    return tree.reparented(host, drop)


@functools.lru_cache(maxsize=65536)
def _is_user_python_event(name: str) -> bool:
    return is_user_file(parse_frame(name).file)


class _Tree:
    """The nesting of host events through parent_id, as row indices (-1: top level)."""

    def __init__(self, host: pa.Table) -> None:
        ids = column_array(host, "id").astype(np.int64)
        raw = host.column("parent_id").to_numpy(zero_copy_only=False).astype(float)
        index = {int(v): i for i, v in enumerate(ids)}
        self.ids = ids
        self.parent = np.array([-1 if np.isnan(p) else index.get(int(p), -1) for p in raw],
                               dtype=np.int64)  # fmt: skip
        start = column_array(host, "start_ns").astype(np.int64)
        dur = column_array(host, "dur_ns").astype(np.int64)
        self.inner_first = np.lexsort((dur, -start))  # children before their parents

    def any_descendant(self, mask: np.ndarray) -> np.ndarray:
        out = np.zeros(len(mask), dtype=bool)
        for i in self.inner_first.tolist():
            p = int(self.parent[i])
            if p >= 0 and (mask[i] or out[i]):
                out[p] = True
        return out

    def child_of(self, mask: np.ndarray) -> np.ndarray:
        has = self.parent >= 0
        out = np.zeros(len(mask), dtype=bool)
        out[has] = mask[self.parent[has]]
        return out

    def reparented(self, host: pa.Table, drop: np.ndarray) -> pa.Table:
        """`host` without the dropped rows, each kept row's parent its nearest kept ancestor."""
        parent = self.parent.copy()
        for i in self.inner_first[::-1].tolist():  # parents first: theirs are already settled
            p = int(parent[i])
            if p >= 0 and drop[p]:
                parent[i] = parent[p]
        ids = np.where(parent >= 0, self.ids[np.maximum(parent, 0)], 0)
        col = pa.array(ids, pa.int64(), mask=parent < 0)
        host = host.set_column(host.schema.get_field_index("parent_id"), "parent_id", col)
        return host.filter(pa.array(~drop))


@functools.lru_cache(maxsize=65536)
def _is_own_python_event(name: str) -> bool:
    """A python event "FILE(LINE): FUNC" whose FILE is the project's own code (by its path:
    torch.profiler trims it to "neuron_explorer/backend/....py" in a checkout on sys.path)."""
    return is_own_file(parse_frame(name).file)


def with_descendants(host: pa.Table, mask: np.ndarray) -> np.ndarray:
    """`mask` extended to every event nested (through parent_id) in a masked one."""
    if not mask.any():
        return mask
    ids = column_array(host, "id").astype(np.int64)
    raw = host.column("parent_id").to_numpy(zero_copy_only=False).astype(float)
    parents = np.where(np.isnan(raw), -1, raw).astype(np.int64)
    index = {int(v): i for i, v in enumerate(ids)}
    out = mask.copy()
    for i in np.argsort(column_array(host, "start_ns"), kind="stable").tolist():
        p = index.get(int(parents[i]), -1)  # parents start before their children
        if p >= 0 and out[p]:
            out[i] = True
    return out

"""The call tree of host time: where the host's time went, by Python call path (the stacks the
profile holds) or by nn.Module path, each node with its self and total time.

Pattern: host spans nest by `parent_id` (python_function frames of imported traces, framework
ops, annotations, runtime calls); an event's path is its parent's path plus its own name, and a
root event that is not a Python frame is placed under the Python stack it ran in (its own
`stack_id`, else the first one found among its descendants, which is how a capture's ops reach
the stacks of the launches inside them). Steps and the profiler's own span are see-through.
Algorithm: self time of an event = its duration minus its host children's; the events are
interned into nodes level by level (numpy, one dict lookup per distinct node), each node's self
is the sum of its events' self, and total = self + the children's totals. Events of every rank
are added together. The largest `max_nodes` nodes by total are kept, with their ancestors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from .page import PageModel

MAX_NODES = 4000  # the page draws the largest nodes; the rest are counted in `dropped_nodes`
SEE_THROUGH = ("step", "other")  # ProfilerStep#N and the profiler's own span are not callers
BY = ("stack", "module")
ROOT_NAME = "(all host time)"
OUTSIDE_MODULES = "(outside any module)"
_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")  # torch.profiler's python_function names
_MAX_DEPTH = 256


@dataclass(frozen=True)
class CallNode:
    """One node: a Python frame (`file`, `line`), a module, or a host span's name."""

    id: int
    parent: int  # -1 for the root
    depth: int
    name: str
    kind: str  # frame (from a stack), python, module, or the events' kind (op, runtime...)
    self_ns: int
    total_ns: int
    events: int  # host events charged here (0 for frames known only from a stack)
    file: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class CallTree(PageModel):
    """The tree, root first and every parent before its children; `to_dict()` is the page's
    JSON twin."""

    by: str
    nodes: tuple[CallNode, ...]
    total_ns: int
    events: int
    dropped_nodes: int
    has_stacks: bool  # any Python stack or python_function frame in the profile
    has_modules: bool  # any host event with an nn.Module path


@dataclass
class _Host:
    """The host events as arrays, with parent rows resolved."""

    parent: np.ndarray  # row of the nearest parent that is not see-through, or -1
    self_ns: np.ndarray
    label: np.ndarray  # code into labels
    labels: list[str]
    kind: np.ndarray  # code into kinds
    kinds: list[str]
    stack: np.ndarray  # own stack id, else a descendant's, else -1
    module: np.ndarray  # code into modules, -1 for none
    modules: list[str]


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """Each row's code into the distinct values (-1 for null): the file's own dictionary when
    the column is dictionary-encoded, as the schema writes strings."""
    if pa.types.is_dictionary(col.type):
        enc = col.unify_dictionaries().combine_chunks() if col.num_chunks else col.combine_chunks()
    else:
        enc = pc.dictionary_encode(col.cast(pa.string())).combine_chunks()
    codes = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, [str(x) for x in enc.dictionary.to_pylist()]


def _rows_of(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row of each wanted id among `ids`, or -1."""
    if len(ids) == 0:
        return np.full(len(wanted), -1, dtype=np.int64)
    # ids are written in order; sorting is needed only for a profile that was not
    order = (
        np.arange(len(ids)) if bool(np.all(ids[1:] > ids[:-1])) else np.argsort(ids, kind="stable")
    )
    pos = np.clip(np.searchsorted(ids[order], wanted), 0, len(ids) - 1)
    return np.where((wanted >= 0) & (ids[order][pos] == wanted), order[pos], -1)


def _host_events(profile: Profile) -> _Host:
    t = profile.table("events", columns=["id", "parent_id", "kind", "name", "dur_ns", "stack_id",
                                         "module"], filter=pc.field("layer") == "host")  # fmt: skip
    ids = t.column("id").to_numpy()
    dur = np.maximum(t.column("dur_ns").fill_null(0).to_numpy(), 0)
    kind, kinds = _codes(t.column("kind"))
    label, labels = _codes(t.column("name"))
    stack = t.column("stack_id").fill_null(-1).to_numpy().astype(np.int64)
    parent = _rows_of(ids, t.column("parent_id").fill_null(-1).to_numpy().astype(np.int64))

    children_ns = np.zeros(len(ids), dtype=np.int64)
    has = parent >= 0
    np.add.at(children_ns, parent[has], dur[has])
    self_ns = np.maximum(dur - children_ns, 0)

    see = np.isin(kind, [kinds.index(k) for k in SEE_THROUGH if k in kinds])
    for _ in range(_MAX_DEPTH):  # skip see-through parents (a step inside a step is rare)
        through = (parent >= 0) & see[np.maximum(parent, 0)]
        if not through.any():
            break
        parent = np.where(through, parent[np.maximum(parent, 0)], parent)
    for _ in range(_MAX_DEPTH):  # a parent without a stack takes its first child's
        need = (parent >= 0) & (stack >= 0)
        need &= stack[np.maximum(parent, 0)] < 0
        if not need.any():
            break
        rows = np.flatnonzero(need)
        first = np.unique(parent[rows], return_index=True)[1]
        stack[parent[rows[first]]] = stack[rows[first]]
    keep = ~see
    remap = np.cumsum(keep) - 1
    parent = np.where(parent >= 0, remap[np.maximum(parent, 0)], -1)[keep]
    module, modules = _codes(t.column("module"))
    return _Host(parent, self_ns[keep], label[keep], labels, kind[keep], kinds, stack[keep],
                 module[keep], modules)  # fmt: skip


class _Nodes:
    """Interned (parent node, label) pairs; node 0 is the root."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, str], int] = {}
        self.parent = [-1]
        self.name = [ROOT_NAME]
        self.kind = ["root"]

    def get(self, parent: int, name: str, kind: str) -> int:
        key = (parent, name)
        node = self.ids.get(key)
        if node is None:
            node = self.ids[key] = len(self.parent)
            self.parent.append(parent)
            self.name.append(name)
            self.kind.append(kind)
        return node

    def children(
        self, parents: np.ndarray, names: np.ndarray, labels: list[str], kind: np.ndarray,
        kinds: list[str],
    ) -> np.ndarray:  # fmt: skip
        """The node of each row's (parent node, label code): one lookup per distinct pair;
        `kind` is each row's kind code into `kinds`, a node takes its first row's."""
        if len(parents) == 0:
            return np.zeros(0, dtype=np.int64)
        width = len(labels) + 1  # one int64 key per pair: a 1-D unique is a hash, not a sort
        uniq, first, inv = np.unique(parents * width + names, return_index=True,
                                     return_inverse=True)  # fmt: skip
        made = [self.get(int(k // width), labels[int(k % width)], kinds[int(kind[f])])
                for k, f in zip(uniq, first, strict=True)]  # fmt: skip
        return np.array(made, dtype=np.int64)[inv.reshape(-1)]


def _stack_prefixes(profile: Profile, nodes: _Nodes, wanted: set[int]) -> dict[int, int]:
    """The node of each stack's innermost frame, its frames interned outermost first."""
    if not wanted:
        return {}
    st = profile.table("stacks", columns=["stack_id", "depth", "file", "line", "function"])
    st = st.filter(
        pc.is_in(st.column("stack_id"), pa.array(sorted(wanted), st.column("stack_id").type))
    )
    frames: dict[int, list[tuple[int, str]]] = {}
    for r in st.to_pylist():
        label = f"{r['file']}({r['line']}): {r['function']}"
        frames.setdefault(int(r["stack_id"]), []).append((int(r["depth"]), label))
    out = {}
    for sid, fr in frames.items():
        node = 0
        for _, label in sorted(fr, reverse=True):  # depth 0 is innermost: outermost first
            node = nodes.get(node, label, "frame")
        out[sid] = node
    return out


def _levels(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), dtype=np.int64)
    cur = parent.copy()
    for _ in range(_MAX_DEPTH):
        has = cur >= 0
        if not has.any():
            break
        depth += has
        cur = np.where(has, parent[np.maximum(cur, 0)], -1)
    return depth


def _by_stack(profile: Profile, host: _Host, nodes: _Nodes) -> np.ndarray:
    """The node of every host event: its parent's node plus its name, roots under their stack."""
    python = host.kinds.index("python") if "python" in host.kinds else -2
    roots = host.parent < 0
    prefixed = roots & (host.stack >= 0) & (host.kind != python)
    prefix = _stack_prefixes(profile, nodes, set(host.stack[prefixed].tolist()))
    node = np.zeros(len(host.parent), dtype=np.int64)
    node[prefixed] = [prefix.get(int(s), 0) for s in host.stack[prefixed]]
    depth = _levels(host.parent)
    for d in range(int(depth.max(initial=-1)) + 1):
        rows = np.flatnonzero(depth == d)
        base = node[rows] if d == 0 else node[host.parent[rows]]
        node[rows] = nodes.children(
            base, host.label[rows], host.labels, host.kind[rows], host.kinds
        )
    return node


def _by_module(host: _Host, nodes: _Nodes) -> np.ndarray:
    """The node of every host event: its module path, then its own name."""
    node_of = np.zeros(len(host.modules) + 1, dtype=np.int64)  # per code; the last: none
    node_of[-1] = nodes.get(0, OUTSIDE_MODULES, "module")
    for code, m in enumerate(host.modules):
        node = nodes.get(0, "(model)", "module")
        for part in m.split(".") if m else ():
            node = nodes.get(node, part, "module")
        node_of[code] = node
    base = node_of[host.module]  # -1, no module, reads the last
    return nodes.children(base, host.label, host.labels, host.kind, host.kinds)


def call_tree(profile: Profile, by: str = "stack", max_nodes: int = MAX_NODES) -> CallTree:
    """The call tree of host time, `by` Python stack or by nn.Module path."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    host = _host_events(profile)
    nodes = _Nodes()
    node = _by_stack(profile, host, nodes) if by == "stack" else _by_module(host, nodes)
    n = len(nodes.parent)
    self_ns = np.bincount(node, weights=host.self_ns, minlength=n).round().astype(np.int64)
    events = np.bincount(node, minlength=n).astype(np.int64)
    parent = np.array(nodes.parent, dtype=np.int64)
    total = self_ns.copy()
    for child in range(n - 1, 0, -1):  # every child was made after its parent
        total[parent[child]] += total[child]
    depth = _levels(parent)
    keep = _largest(parent, total, max_nodes)
    new_id = {int(old): i for i, old in enumerate(keep)}
    out = []
    for old in keep:
        m = _FRAME.match(nodes.name[old]) if nodes.kind[old] in ("frame", "python") else None
        out.append(CallNode(new_id[int(old)], new_id.get(int(parent[old]), -1), int(depth[old]),
                            nodes.name[old], nodes.kind[old], int(self_ns[old]), int(total[old]),
                            int(events[old]), m.group(1) if m else None,
                            int(m.group(2)) if m else None))  # fmt: skip
    python = "python" in host.kinds and bool((host.kind == host.kinds.index("python")).any())
    return CallTree(by, tuple(out), int(total[0]), int(len(node)), n - len(keep),
                    python or bool((host.stack >= 0).any()),
                    bool((host.module >= 0).any()))  # fmt: skip


def _largest(parent: np.ndarray, total: np.ndarray, max_nodes: int) -> np.ndarray:
    """The nodes to show, in id order (parents first): the largest by total, with ancestors."""
    if len(parent) <= max_nodes:
        return np.arange(len(parent))
    chosen = np.zeros(len(parent), dtype=bool)
    chosen[np.argsort(-total, kind="stable")[:max_nodes]] = True
    for child in range(len(parent) - 1, 0, -1):  # a node's total never exceeds its parent's,
        if chosen[child]:  # but ties may leave a parent out: keep the path whole
            chosen[parent[child]] = True
    return np.flatnonzero(chosen)

"""A compiled graph kept for later: its GraphOps as JSON texts, one row per op, and back.

A capture keeps the graph each NEFF was lowered from (the profile's `graphs` table), so that
`whatif --chip` lowers the NEFF again with `graph.lower_graph` for another chip and reads each
fused group's time with `group_span`, as the device does when it records the kernel. A graph
is named by a hash of its rows: the same graph lowered twice, or on two ranks, is kept once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from . import custom
from .graph import GraphOp, lower_graph
from .graph_neff import group_span
from .plan import TensorInfo
from .spec import DeviceSpec

MODELED_NAMESPACES = ("aten", "prims")  # ops the model lowers without a user's declaration

# one row per op: (op, inputs, outputs, sources, exported), the last four JSON texts
Row = tuple[str, str, str, str, str]


def _tensor(t: TensorInfo) -> list:
    return [list(t.shape), t.dtype, 1] if t.transposed else [list(t.shape), t.dtype]


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def to_rows(graph: Sequence[GraphOp]) -> tuple[Row, ...]:
    """The graph as rows of JSON texts: tensors as [shape, dtype] ([shape, dtype, 1] when
    transposed), sources as [op, output] or null (graph input k is op -1 - k), exported as
    0/1 per output."""
    return tuple(
        (g.op, _dumps([_tensor(t) for t in g.inputs]), _dumps([_tensor(t) for t in g.outputs]),
         _dumps([list(s) if s is not None else None for s in g.sources]),
         _dumps([int(e) for e in g.exported]))
        for g in graph
    )  # fmt: skip


def graph_key(rows: Sequence[Row]) -> str:
    """The graph's name in a profile: a hash of its rows (16 hex digits)."""
    h = hashlib.sha1(usedforsecurity=False)
    for row in rows:
        h.update("\x1f".join(row).encode())
        h.update(b"\x1e")
    return h.hexdigest()[:16]


def _tensors(text: str) -> tuple[TensorInfo, ...]:
    out = []
    for t in json.loads(text):
        shape, dtype = t[0], t[1]
        if not isinstance(shape, list) or not isinstance(dtype, str):
            raise ValueError(f"a tensor {t!r:.60} is not [shape, dtype]")
        out.append(TensorInfo(tuple(int(d) for d in shape), dtype, len(t) > 2 and bool(t[2])))
    return tuple(out)


def from_rows(rows: Sequence[Row]) -> tuple[GraphOp, ...]:
    """The GraphOps of `to_rows`' rows; ValueError (or TypeError, IndexError) on rows that
    are not."""
    graph = []
    for i, (op, inputs, outputs, sources, exported) in enumerate(rows):
        ins, outs = _tensors(inputs), _tensors(outputs)
        src = tuple(None if s is None else (int(s[0]), int(s[1])) for s in json.loads(sources))
        if len(src) != len(ins) or any(s is not None and s[0] >= i for s in src):
            raise ValueError(f"op {i} ({op:.40}): its sources do not fit its inputs")
        graph.append(GraphOp(str(op), ins, outs, src, tuple(bool(e) for e in json.loads(exported))))
    return tuple(graph)


def undeclared_op(graph: Sequence[GraphOp]) -> str | None:
    """The first op of the graph this process cannot lower as the capture did: one of another
    namespace with no kernel declared here (register_kernel declares it per process)."""
    for g in graph:
        if g.op.split("::", 1)[0] not in MODELED_NAMESPACES and custom.declared(g.op) is None:
            return g.op
    return None


def group_times(
    graph: Sequence[GraphOp], spec: DeviceSpec, faster: Mapping[int, float] | None = None
) -> tuple[tuple[str, int], ...]:
    """Each fused group's (kernel name, duration in ns) when the graph's NEFF is lowered for
    `spec` (with `faster`'s ops sped up: lower_graph) and runs on an idle device, as a capture
    records it (the NEFF is one unit on the timeline, each group's kernel its span in it)."""
    return _spans(lower_graph(graph, "neff", spec, faster))


def faster_times(
    graph: Sequence[GraphOp], spec: DeviceSpec, faster: Mapping[int, float]
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...], frozenset[int]]:
    """The groups' times as captured and with `faster`'s ops sped up (group_times), and the
    groups that run one of those ops (sped up, a group's kernel is the same kernel: grouping
    reads what kind each op is, not its time)."""
    neff = lower_graph(graph, "neff", spec)
    holding = frozenset(gi for gi, g in enumerate(neff.groups) if set(g.ops) & set(faster))
    return _spans(neff), group_times(graph, spec, faster), holding


def _spans(neff) -> tuple[tuple[str, int], ...]:
    offsets = neff.plan.idle_schedule[0]
    out = []
    for g in neff.groups:
        start, end = group_span(g.plan, g.instr_index, offsets)
        out.append((g.plan.name, end - start))
    return tuple(out)

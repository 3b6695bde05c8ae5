"""`whatif --chip`: a step's kernels lowered again for another chip, by the device's own cost
model. An eager kernel is one op, lowered from the op, shapes and dtypes its event holds. A
compiled graph's kernel is a fused group of a NEFF: its time depends on the whole graph (what
fuses, what stays in SBUF, what prefetches under what), so the graph the NEFF was lowered from
is read from the profile's `graphs` table (kept at capture), lowered again for each chip, and
the group's span read as the device records it (costmodel/graph_record.py). A profile captured
before graphs were kept leaves its compiled kernels at their recorded time, and says so.

Each kernel's new time is its recorded time times the ratio of its lowered times on the two
chips, so a kernel the model gives back exactly is exactly its time on the new chip.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence

import pyarrow.compute as pc

from ..errors import BadInputError, ExplorerError
from ..model.profile import Profile
from .depgraph import Graph, Node
from .replay import Change

GroupTimes = tuple[tuple[str, int], ...]  # per fused group: (kernel name, ns)


def chip_change(graph: Graph, profile: Profile, chip: str) -> Change:
    """Each kernel of the step lowered again for `chip`: its recorded time times the cost
    model's ratio of its time on `chip` to its time on the chip it was captured for."""
    from ..backend.costmodel.spec import get_spec

    if not graph.modeled:
        raise ExplorerError(f"{profile.path}: --chip needs a neuron capture (this is an import)")
    try:
        new = get_spec(chip)
    except (KeyError, ValueError) as e:
        raise ExplorerError(f"--chip {chip!r}: {e}") from None
    old = get_spec(profile.manifest.spec.name or "trn2")
    device = [n for n in graph.nodes if not n.host and n.kind == "device"]
    durations, unmatched = _compiled(profile, [n for n in device if n.neff is not None], old, new)
    compiled = len(durations)
    kept = 0  # device work with no op and shapes to lower again (a compiled graph's groups)
    for n in device:
        if n.event_id in durations or n.event_id in unmatched:
            continue
        if not n.op_name or not n.shapes:
            kept += 1
            continue
        t = _eager_ns(n, old, new)
        if t is not None:
            durations[n.event_id] = t
    what = f"{len(durations)} kernels lowered for {new.name} (captured on {old.name})"
    if compiled:
        what += f", {compiled} of them compiled graphs' fused groups (their NEFFs lowered again)"
    if unmatched:
        what += (
            f", {len(unmatched)} compiled kernels kept at their {old.name} time (their graph, "
            "lowered here, does not give them back: it holds an op declared with "
            "register_kernel in the captured process, or the graph is not this one's)"
        )
    if kept:  # say so rather than price them on the old chip silently
        what += (
            f", {kept} kept at their {old.name} time (no op and shapes recorded to lower "
            "again: a compiled graph's fused groups)"
        )
    return Change(what, durations)


def _eager_ns(n: Node, old, new) -> int | None:
    """An eager kernel's time on `new`, lowered from its op, shapes and dtypes."""
    from ..backend.costmodel import TensorInfo, lower_op

    try:
        shapes = json.loads(n.shapes or "[]")
        dtypes = json.loads(n.dtypes or "[]")
        ins = [TensorInfo(tuple(int(d) for d in s), str(dtypes[i]) if i < len(dtypes) else
                          "float32") for i, s in enumerate(shapes) if isinstance(s, list)]  # fmt: skip
    except (ValueError, TypeError):
        return None
    t_old, t_new = (_plan_ns(lower_op(n.op_name or "", ins, spec=s)) for s in (old, new))
    return round(n.dur_ns * t_new / t_old) if t_old > 0 else None


def _plan_ns(plan) -> int:
    starts, _, first, last = plan.idle_schedule
    return int(last - first) if starts else 0


def _compiled(profile: Profile, nodes: Sequence[Node], old, new) -> tuple[dict[int, int], set[int]]:
    """event id -> new time of each compiled kernel whose graph the profile keeps and whose
    group the graph, lowered for the captured chip, gives back (same kernel name); and the
    ids of those whose kept graph does not give them back."""
    where = groups_of(profile, [n.event_id for n in nodes])
    times = _graph_times(profile, {key for key, _ in where.values()}, old, new)
    out, unmatched = {}, set()
    for n in nodes:
        key, group = where.get(n.event_id, ("", -1))
        if key not in times:
            continue  # no graph kept for it: kept at its time
        before, after = times[key]
        if not 0 <= group < len(before) or before[group][0] != n.name:
            unmatched.add(n.event_id)  # not this graph's kernel as recorded: kept at its time
            continue
        t_old, t_new = before[group][1], after[group][1]
        out[n.event_id] = round(n.dur_ns * t_new / t_old) if t_old > 0 else t_new
    return out, unmatched


def groups_of(profile: Profile, ids: list[int]) -> dict[int, tuple[str, int]]:
    """event id -> (graph key, group index) from each compiled kernel's args."""
    if not ids:
        return {}
    t = profile.table("events", columns=["id", "args"], filter=pc.field("id").isin(ids))
    out = {}
    for eid, text in zip(t.column("id").to_pylist(), t.column("args").to_pylist(), strict=True):
        try:
            args = json.loads(text) if text else {}
        except ValueError:
            continue
        key = args.get("neff_graph") if isinstance(args, dict) else None
        group = args.get("neff_group") if isinstance(args, dict) else None
        if isinstance(key, str) and type(group) is int:
            out[eid] = (key, group)
    return out


def _graph_times(
    profile: Profile, keys: set[str], old, new
) -> dict[str, tuple[GroupTimes, GroupTimes]]:
    """Each kept graph's fused groups timed on the captured chip and on the new one (none for
    a graph this process cannot lower as the capture did: undeclared_op)."""
    from ..backend.costmodel.graph_record import group_times, undeclared_op

    out = {}
    for key, ops in kept_graphs(profile, keys).items():
        out[key] = (
            ((), ()) if undeclared_op(ops) else (group_times(ops, old), group_times(ops, new))
        )
    return out


def kept_graphs(profile: Profile, keys: set[str]) -> dict[str, tuple]:
    """graph key -> its GraphOps, for each of `keys` the profile's `graphs` table keeps (a
    one-line error naming graphs.parquet when its rows are not a graph)."""
    from ..backend.costmodel.graph_record import from_rows

    table = profile.optional_table("graphs", pc.field("graph").isin(sorted(keys))) if keys else None
    if table is None:
        return {}
    rows: dict[str, list] = defaultdict(list)
    cols = [table.column(c).to_pylist() for c in
            ("graph", "op_index", "op", "inputs", "outputs", "sources", "exported")]  # fmt: skip
    for key, index, *row in zip(*cols, strict=True):
        rows[key].append((index, tuple(row)))
    out = {}
    for key, found in rows.items():
        found.sort(key=lambda r: r[0])
        try:
            if [i for i, _ in found] != list(range(len(found))):
                raise ValueError("its op_index is not 0, 1, 2, ...")
            out[key] = from_rows([r for _, r in found])
        except (ValueError, TypeError, IndexError, KeyError) as e:
            raise BadInputError(profile.path / "graphs.parquet", f"graph {key}: {e}") from None
    return out

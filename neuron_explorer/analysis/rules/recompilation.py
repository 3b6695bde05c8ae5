"""recompilation: changing input shapes recompile the graph or the ops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..context import AnalysisContext
from ..conventions import COMPILE_GROUP_SQL, PROGRAM_SQL, TRACE_COMPILE_PREDICATE
from ..findings import Evidence, Hotspot
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, longest_ids, top_lines, torch_compile_trace_ns
from ..shapes import parse_shapes

RECOMPILE = "id IN (SELECT id FROM recompiles)"
IS_GRAPH = "coalesce(op_name, '') LIKE 'neuron_graph_%'"
# what the fix removes: the recompiles and torch.compile's tracing spans around them
COMPILED_AGAIN = (
    f"{RECOMPILE} OR ({TRACE_COMPILE_PREDICATE} AND EXISTS (SELECT 1 FROM recompiles r "
    "WHERE r.rank = ev.rank AND r.start_ns >= ev.start_ns "
    "AND r.start_ns + r.dur_ns <= ev.start_ns + ev.dur_ns))"
)


def _what(graphs: int, pieces: int, eager: int) -> str:
    """'1 graph(s), 2 forward/backward compile(s) and 5 eager op(s)', for titles."""
    parts = []
    if graphs:
        parts.append(f"{graphs} graph(s), {pieces} forward/backward compile(s)")
    if eager:
        parts.append(f"{eager} eager op(s)")
    return " and ".join(parts) or "no program named"


def suggest_buckets(shapes: list[str], multiple: int) -> str:
    """Name the dims that change across compiled signatures and the padded sizes to use."""
    sigs = [parse_shapes(s) for s in shapes]
    sigs = [s for s in sigs if s]
    if len(sigs) < 2:
        return ""
    out = []
    first = sigs[0]
    for i, arg in enumerate(first):
        if not isinstance(arg, list):
            continue
        for d in range(len(arg)):
            vals = {
                s[i][d]
                for s in sigs
                if i < len(s)
                and isinstance(s[i], list)
                and d < len(s[i])
                and isinstance(s[i][d], int)
            }
            if len(vals) > 1:
                padded = sorted({-(-v // multiple) * multiple for v in vals})
                out.append(
                    f"input {i} dim {d} takes {len(vals)} sizes "
                    f"({min(vals)}..{max(vals)}): pad to {padded[:6]}"
                )
    return "; ".join(out[:3])


def _shapes_note(shapes: list[str], multiple: int) -> str:
    if not shapes:
        return ""
    return suggest_buckets(shapes, multiple) or f"shapes: {', '.join(sorted(shapes)[:5])}"


@dataclass(frozen=True)
class Recompiles:
    programs: int  # compiled again (a graph signature's forward and backward are one)
    compile_ns: int
    graphs: int = 0
    pieces: int = 0  # the graphs' forward/backward compiles
    eager: int = 0  # eager ops compiled again
    trace_ns: int = 0  # torch.compile's own spans around them


class Recompilation(Rule[Recompiles]):
    """Graph or op recompiles caused by changing input shapes.

    Pattern: with torch.compile(backend="neuron", dynamic=False) (and for eager ops, whose
    kernels are compiled per (op, shapes, dtypes)), every new input shape compiles again: a
    variable sequence length or a last partial batch recompiles in the middle of training.
    Algorithm: the recompiles are the compile events named "recompile" (or with args.reason
    "recompile"), compiles of a graph's later shape signatures (op_name
    neuron_graph_<graph>_<signature>, signature >= 1) and any compile after a rank's first step;
    grouped by graph (or op) and counted as programs (a graph signature's forward and backward
    compiles are one); report when there are at least MIN_RECOMPILES. What they cost is their
    compile time plus the rest of torch.compile's own spans (entire_frame_compile,
    entire_backward_compile: tracing, AOT autograd) that enclose them; the saving is the
    replay of that host time removed from the steps.
    Evidence: the shapes that caused them and padded sizes (multiples of BUCKET_MULTIPLE) that
    would collapse them into a few signatures.
    """

    id = "recompilation"
    title = "Recompiles from changing shapes"
    severity = "medium"
    scope = "neuron"
    MIN_RECOMPILES = 2
    BUCKET_MULTIPLE = 128  # the TensorE tile size; padded dims also waste no tile rows
    fix = (
        "Keep input shapes fixed: pad or bucket variable dimensions to a few named sizes, "
        "drop the last partial batch (DataLoader(drop_last=True)), or mark the dimension "
        "dynamic where the backend supports it."
    )

    def measure(self, ctx: AnalysisContext) -> Recompiles:
        # count programs: a graph recompile is a marker plus forward and backward compiles
        agg = ctx.one(
            f"""SELECT count(DISTINCT {PROGRAM_SQL}) AS n, coalesce(sum(dur_ns), 0) AS ns
            FROM recompiles"""
        )
        n, ns = int(agg.get("n") or 0), int(agg.get("ns") or 0)
        if n < self.MIN_RECOMPILES:  # what was compiled is read only for a finding
            return Recompiles(n, ns)
        # what was compiled again, so a count reads right: one shape change of a compiled model
        # is one graph program (its forward and backward compiles), plus each eager op outside
        # the graph that met the new shape
        kinds = ctx.one(
            f"""SELECT count(DISTINCT {PROGRAM_SQL}) FILTER (WHERE {IS_GRAPH}) AS graphs,
                   count(*) FILTER (WHERE {IS_GRAPH} AND name <> 'recompile') AS pieces,
                   count(DISTINCT {PROGRAM_SQL}) FILTER (WHERE NOT {IS_GRAPH}) AS eager
            FROM recompiles"""
        )
        graphs, pieces, eager = (int(kinds.get(k) or 0) for k in ("graphs", "pieces", "eager"))
        # torch.compile's own spans around a recompile (tracing, AOT autograd) are its cost too
        trace_ns = torch_compile_trace_ns(ctx, around_recompiles=True)
        return Recompiles(n, ns, graphs, pieces, eager, trace_ns)

    def gate(self, facts: Recompiles) -> bool:
        return facts.programs >= self.MIN_RECOMPILES

    def evidence(self, ctx: AnalysisContext, facts: Recompiles) -> Evidence:
        groups: list[dict[str, Any]] = ctx.rows(
            f"""SELECT {COMPILE_GROUP_SQL} AS label, count(DISTINCT {PROGRAM_SQL}) AS count,
                   sum(dur_ns) AS dur_ns,
                   list(DISTINCT coalesce(json_extract_string(args, '$.shapes'), shapes))
                       AS shapes
            FROM recompiles GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5"""
        )
        ops = tuple(
            Hotspot(
                label=str(g["label"]),
                dur_ns=int(g["dur_ns"]),
                count=int(g["count"]),
                note=_shapes_note([s for s in g["shapes"] if s], self.BUCKET_MULTIPLE),
            )
            for g in groups
        )
        return Evidence(
            event_ids=longest_ids(ctx, RECOMPILE),
            ops=ops,
            source_lines=top_lines(ctx, RECOMPILE),
            metrics={
                "recompiles": facts.programs,
                "recompile_ns": facts.compile_ns,
                "trace_ns": facts.trace_ns,
                "graph_recompiles": facts.graphs,
                "graph_compile_pieces": facts.pieces,
                "op_recompiles": facts.eager,
            },  # fmt: skip
        )

    def explain(self, facts: Recompiles, evidence: Evidence) -> Draft:
        n, ns, trace_ns = facts.programs, facts.compile_ns, facts.trace_ns
        what = _what(facts.graphs, facts.pieces, facts.eager)
        worst = evidence.ops[0].label if evidence.ops else "?"
        return Draft(
            title=f"{n} recompiles from new input shapes ({what}), {fmt_ms(ns + trace_ns)}, "
            f"worst: {worst}",
            detail=(
                f"{n} programs were compiled again for input shapes not seen before "
                f"({what}), costing {fmt_ms(ns)} in compiles"
                + (f" and {fmt_ms(trace_ns)} in torch.compile's tracing" if trace_ns else "")
                + ". With dynamic=False each distinct shape is "
                "a new program; padding to a few sizes makes later steps hit the cache."
            ),
            saving_ns=ns + trace_ns,
            evidence=evidence,
            change=Replayed(
                f"these {n} recompiles and the tracing around them removed from the host",
                COMPILED_AGAIN,
                "remove_host",
            ),
        )

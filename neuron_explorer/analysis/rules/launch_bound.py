"""launch-bound: many tiny kernels and an idle device: the host cannot launch fast enough."""

from __future__ import annotations

from dataclasses import dataclass

from ..compiled import CompileState, compile_state
from ..context import AnalysisContext
from ..conventions import KERNEL_KINDS, sql_list
from ..facts import (
    LAUNCH_MIN_IDLE_SHARE,
    LAUNCH_MIN_KERNELS_PER_STEP,
    OPTIMIZER_MIN_OPS_PER_STEP,
    TINY_KERNEL_NS,
)
from ..findings import Evidence, Hotspot
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct, hotspots, longest_ids

KERNELS = f"layer = 'device' AND kind IN {sql_list(KERNEL_KINDS)}"
# one launch: the kernels of one program share their launch's flow (a compiled graph's many
# kernels are one launch, as one NEFF runs); a kernel without a flow is its own launch
LAUNCH = "coalesce(flow_id, -id)"
# the host's per-op dispatch in the launch-bound steps: each outermost host op (no host op
# around it), except those holding what a more specific rule owns (a compile, a CPU fallback,
# a sync: their idle time is not launch-bound's); in a step by one ASOF join with the steps'
# disjoint spans (facts.launch_bound_spans)
DISPATCH = (
    "layer = 'host' AND kind = 'op' AND (parent_id IS NULL OR parent_id NOT IN "
    "(SELECT id FROM ev WHERE layer = 'host' AND kind = 'op')) AND id IN (SELECT x.id "
    "FROM ev x ASOF JOIN launch_bound_spans s ON x.rank = s.rank AND x.start_ns >= s.s "
    "WHERE x.start_ns < s.e AND x.layer = 'host' AND x.kind = 'op') "
    "AND NOT EXISTS (SELECT 1 FROM ev x WHERE x.layer = 'host' "
    "AND x.kind IN ('compile', 'fallback', 'sync') AND x.rank = ev.rank "
    "AND x.track = ev.track AND x.start_ns >= ev.start_ns "
    "AND x.start_ns < ev.start_ns + ev.dur_ns)"
)


@dataclass(frozen=True)
class Bound:
    """The launch-bound steps (the shared `launch_bound_steps`), summed, and what the profile
    shows about compiling and the optimizer (for the advice)."""

    steps: int
    kernels: int
    launches: int  # the programs launched: a compiled graph's kernels count once
    idle_ns: int  # idle time no more specific rule explains
    step_ns: int
    median_kernel_ns: float  # the lowest median kernel of the launch-bound ranks
    neuron: bool
    unfused: bool  # an optimizer step of many per-parameter ops (as unfused-optimizer judges)
    state: CompileState


class LaunchBound(Rule[Bound]):
    """Steps made of many tiny kernels with the device mostly idle.

    Pattern: eager mode issues one kernel per op; when each kernel is shorter than the host's
    cost to dispatch and launch it, the device idles between launches (GPU or neuron).
    Algorithm: per step, take the kernel count and the device idle time from the step
    breakdown, less the idle time that overlaps compiles, fallbacks, syncs or data loading (the
    more specific rules report that), and the median kernel duration of the rank. A step is
    launch-bound when it has at least MIN_KERNELS_PER_STEP kernels, a median kernel under
    TINY_KERNEL_NS and that idle time is at least MIN_IDLE_SHARE of the step. The saving is a
    replay of fewer, larger launches: the host's per-op dispatch in those steps (each
    outermost host op, except those holding a compile, a fallback or a sync) cut by
    RECOVERABLE_SHARE, the kernels kept, so the step shortens until the device's own work sets
    it. The title and evidence
    count launches, not kernels: a program's kernels share its launch's flow, so a compiled
    graph counts once (its entry line is cited with its launches).
    Fix: conditional on what the profile shows works for the model (analysis/compiled.py):
    with a compiled step and no recompiles, compile what still runs eagerly (and name the
    graph breaks when a step runs several graphs); with recompiles, fix the shapes first;
    with no compiled step, check the model with torch._dynamo.explain's graph-break report
    before compiling (torch.compile fails on some models). Always also the fixes that need
    no compiler: a multi-tensor/fused optimizer, fewer small ops, a larger batch.
    """

    id = "launch-bound"
    title = "Launch-bound: many tiny kernels, idle device"
    severity = "medium"
    # the shared launch-bound steps use these (analysis/facts.py; device-idle-gaps reads them)
    MIN_KERNELS_PER_STEP = LAUNCH_MIN_KERNELS_PER_STEP
    TINY_KERNEL_NS = TINY_KERNEL_NS  # a kernel shorter than this costs about as much to launch
    MIN_IDLE_SHARE = LAUNCH_MIN_IDLE_SHARE
    RECOVERABLE_SHARE = 0.5  # of the host's dispatch, what fusing launches typically removes
    fix = (
        "Fewer, larger launches. If the profile shows a compiled step without recompiles, "
        "compile what still runs eagerly; otherwise check the model first with "
        "torch._dynamo.explain(model)(*inputs) (its graph-break report), then wrap the step in "
        "torch.compile (backend='neuron' on the neuron device; mode='reduce-overhead' for CUDA "
        "graphs on GPU). Without a compiler: a multi-tensor or fused optimizer (foreach=True; "
        "fused=True on GPU), fewer small ops at the lines launched most, a larger batch."
    )

    def measure(self, ctx: AnalysisContext) -> Bound | None:
        agg = ctx.one(
            """SELECT count(*) AS steps, sum(kernels) AS kernels, sum(idle_ns) AS idle_ns,
                   sum(dur_ns) AS step_ns FROM launch_bound_steps"""
        )
        if not agg.get("steps"):
            return None
        ranks = ctx.rows(
            f"""SELECT med, device FROM kernel_medians
            WHERE med < {TINY_KERNEL_NS} AND med IS NOT NULL"""
        )
        kernels = ctx.events_of(KERNEL_KINDS, "device")
        launches = ctx.one(
            f"""SELECT count(DISTINCT {LAUNCH}) AS n FROM {kernels} k
                ASOF JOIN launch_bound_spans s ON k.rank = s.rank AND k.start_ns >= s.s
            WHERE {KERNELS} AND k.start_ns < s.e"""
        )
        unfused = ctx.one(
            f"""SELECT count(*) AS n FROM optimizer_steps
            WHERE ops >= {OPTIMIZER_MIN_OPS_PER_STEP} AND fused = 0"""
        )
        return Bound(
            steps=int(agg["steps"]),
            kernels=int(agg["kernels"]),
            launches=int(launches.get("n") or 0) or int(agg["kernels"]),
            idle_ns=int(agg["idle_ns"]),
            step_ns=int(agg["step_ns"]),
            median_kernel_ns=float(min(r["med"] for r in ranks)),
            neuron=any(str(r["device"] or "").startswith("neuron") for r in ranks),
            unfused=bool(unfused["n"]),
            state=compile_state(ctx),
        )

    def gate(self, facts: Bound) -> bool:
        return facts.steps > 0  # the thresholds chose the shared launch-bound steps

    def evidence(self, ctx: AnalysisContext, facts: Bound) -> Evidence:
        state = facts.state
        return Evidence(
            event_ids=longest_ids(ctx, KERNELS),
            ops=most_launched(ctx, "coalesce(op_name, name)"),
            source_lines=most_launched(ctx, "src_file || ':' || src_line"),
            metrics={
                "steps": facts.steps,
                "kernels": facts.kernels,
                "launches": facts.launches,
                "median_kernel_ns": facts.median_kernel_ns,
                "idle_ns": facts.idle_ns,
                "idle_share": round(facts.idle_ns / facts.step_ns, 4),
                "graph_kernels": state.graph_kernels,
                "eager_kernels": state.eager_kernels,
                "graphs_per_step": state.graphs_per_step,
                "recompiles": state.recompiles,
            },
        )

    def explain(self, facts: Bound, evidence: Evidence) -> Draft:
        n, kernels, idle_ns, median_ns = (
            facts.steps,
            facts.kernels,
            facts.idle_ns,
            facts.median_kernel_ns,
        )
        launches = facts.launches
        programs = (
            f"{launches} programs ({kernels} kernels: a compiled graph's kernels are one launch)"
            if launches < kernels
            else f"{kernels} kernels"
        )
        return Draft(
            title=f"Launch-bound: {n} steps of ~{launches // n} launches "
            f"(median kernel {median_ns / 1000:.1f} us), device idle "
            f"{fmt_pct(idle_ns / facts.step_ns)}",
            detail=(
                f"{n} steps launch {programs}, the median kernel running "
                f"{median_ns / 1000:.1f} us, while the device is idle {fmt_ms(idle_ns)} of "
                f"{fmt_ms(facts.step_ns)}: the host's per-op dispatch, not the device, sets the "
                "step time."
                + (
                    " On the neuron device each eager op is a separate launch."
                    if facts.neuron
                    else ""
                )
            ),
            saving_ns=idle_ns * self.RECOVERABLE_SHARE,
            fix=advice(facts.state, facts.neuron, facts.unfused, n),
            evidence=evidence,
            change=Replayed(
                f"the host's per-op dispatch in these {n} steps cut by "
                f"{self.RECOVERABLE_SHARE:.0%} (its ops fused into fewer launches; the kernels "
                "kept)",
                DISPATCH,
                "remove_host",
                factor=self.RECOVERABLE_SHARE,
            ),
        )


def most_launched(ctx: AnalysisContext, label: str, limit: int = 5) -> tuple[Hotspot, ...]:
    """The ops (or user lines) that launch most, by launches: a compiled graph's kernels, each
    taking the graph's entry line, count once."""
    rows = ctx.rows(
        f"""SELECT {label} AS label, any_value(src_file) AS file, any_value(src_line) AS line,
               any_value(src_func) AS func, sum(dur_ns) AS dur_ns,
               count(DISTINCT {LAUNCH}) AS count
        FROM {ctx.events_of(KERNEL_KINDS, "device")} WHERE {KERNELS} AND {label} IS NOT NULL
        GROUP BY 1 ORDER BY count DESC, dur_ns DESC, label LIMIT {int(limit)}"""
    )
    if not label.startswith("src_file"):
        rows = [{**r, "file": None, "line": None, "func": None} for r in rows]
    return hotspots(rows)


def advice(state: CompileState, neuron: bool, unfused: bool, steps: int) -> str:
    """The fix, from what this profile shows works for the model (and what needs no compiler)."""
    how = "torch.compile(backend='neuron')" if neuron else "torch.compile(mode='reduce-overhead')"
    if state.compiled and not state.recompiles:
        eager = state.eager_kernels // max(steps, 1)
        first = (
            "torch.compile works for this model: the profile runs a compiled step with no "
            f"recompiles. Compile what still runs eagerly (~{eager} kernels a step; the ops "
            "launched most are in the evidence), e.g. the loss and the optimizer step."
        )
        if state.graphs_per_step > 1:
            first += (
                f" A step runs {state.graphs_per_step} compiled graphs, so graph breaks split "
                "it: torch._dynamo.explain(model)(*inputs) lists them and why."
            )
    elif state.compiled:
        first = (
            "The profile runs compiled graphs but compiles them again for new shapes (see "
            "recompilation): fix the shapes first, then compile what still runs eagerly."
        )
    else:
        first = (
            "The profile has no compiled step, so it does not show that torch.compile works "
            "for this model. Check first: torch._dynamo.explain(model)(*inputs) reports the "
            f"graph breaks; with few, wrap the step in {how} and profile again."
        )
    optimizer = (
        "the optimizer updates parameters one by one (unfused-optimizer): make it multi-tensor"
        if unfused
        else "a multi-tensor or fused optimizer if it is not one"
    )
    return (
        f"{first} Fixes that need no compiler: {optimizer} (foreach=True; fused=True on GPU); "
        "fewer small "
        "ops at the lines launched most (evidence): one batched tensor op instead of a Python "
        "loop over tensors, no redundant casts or copies; and a larger batch: a step launches "
        "as many kernels, each doing more work."
    )

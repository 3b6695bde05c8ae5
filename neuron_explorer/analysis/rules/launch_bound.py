"""launch-bound: many tiny kernels and an idle device: the host cannot launch fast enough."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..compiled import CompileState, compile_state
from ..context import AnalysisContext
from ..conventions import KERNEL_KINDS, sql_list
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, fmt_pct, longest_ids, register, top_lines, top_ops
from .unfused_optimizer import UnfusedOptimizer


@register
class LaunchBound(Rule):
    """Steps made of many tiny kernels with the device mostly idle.

    Pattern: eager mode issues one kernel per op; when each kernel is shorter than the host's
    cost to dispatch and launch it, the device idles between launches (GPU or neuron).
    Algorithm: per step, take the kernel count and the device idle time from the step
    breakdown, less the idle time that overlaps compiles, fallbacks, syncs or data loading (the
    more specific rules report that), and the median kernel duration of the rank. A step is
    launch-bound when it has at least MIN_KERNELS_PER_STEP kernels, a median kernel under
    TINY_KERNEL_NS and that idle time is at least MIN_IDLE_SHARE of the step. The saving
    assumed is RECOVERABLE_SHARE of the idle time in those steps.
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
    MIN_KERNELS_PER_STEP = 50
    TINY_KERNEL_NS = 20_000  # a kernel shorter than this costs about as much to launch
    MIN_IDLE_SHARE = 0.30
    RECOVERABLE_SHARE = 0.5  # of the idle time, what fusing launches typically wins back
    fix = (
        "Fewer, larger launches. If the profile shows a compiled step without recompiles, "
        "compile what still runs eagerly; otherwise check the model first with "
        "torch._dynamo.explain(model)(*inputs) (its graph-break report), then wrap the step in "
        "torch.compile (backend='neuron' on the neuron device; mode='reduce-overhead' for CUDA "
        "graphs on GPU). Without a compiler: a multi-tensor or fused optimizer (foreach=True; "
        "fused=True on GPU), fewer small ops at the lines launched most, a larger batch."
    )

    def bound_steps(self, ctx: AnalysisContext) -> tuple[pa.Table | None, dict]:
        """The launch-bound step windows (breakdown rows plus idle_ns, the idle time no more
        specific rule explains; None when there are none) and the per-rank median kernels."""
        none: tuple[pa.Table | None, dict] = (None, {})
        if not ctx.device_ranks:
            return none
        med = ctx.rows(
            f"""SELECT rank, median(dur_ns) AS med, any_value(device) AS device
            FROM {ctx.events_of(KERNEL_KINDS, "device")}
            WHERE layer = 'device' AND kind IN {sql_list(KERNEL_KINDS)} GROUP BY rank"""
        )
        tiny = {int(r["rank"]): r for r in med if r["med"] is not None}
        tiny = {k: v for k, v in tiny.items() if v["med"] < self.TINY_KERNEL_NS}
        if not tiny:
            return none
        b = ctx.breakdown
        explained = ctx.explained_idle["explained_idle_ns"]  # same rows and order
        b = b.append_column("idle_ns", pc.subtract(b["device_idle_ns"], explained))
        b = b.filter(pc.is_in(b["rank"], value_set=pa.array(list(tiny), pa.int32())))
        b = b.filter(pc.greater_equal(b["kernels"], self.MIN_KERNELS_PER_STEP))
        idle = pc.divide(pc.cast(b["idle_ns"], "double"), pc.cast(b["dur_ns"], "double"))
        return b.filter(pc.greater_equal(idle, self.MIN_IDLE_SHARE)), tiny

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        b, tiny = self.bound_steps(ctx)
        if b is None or b.num_rows == 0:
            return []
        idle_ns = int(pc.sum(b["idle_ns"]).as_py())
        step_ns = int(pc.sum(b["dur_ns"]).as_py())
        kernels = int(pc.sum(b["kernels"]).as_py())
        median_ns = float(min(v["med"] for v in tiny.values()))
        neuron = any(str(v["device"] or "").startswith("neuron") for v in tiny.values())
        where = f"layer = 'device' AND kind IN {sql_list(KERNEL_KINDS)}"
        state = compile_state(ctx)
        unfused = bool(UnfusedOptimizer().check(ctx))
        return [
            self.finding(
                ctx,
                title=f"Launch-bound: {b.num_rows} steps of ~{kernels // b.num_rows} kernels "
                f"(median {median_ns / 1000:.1f} us), device idle {fmt_pct(idle_ns / step_ns)}",
                detail=(
                    f"{b.num_rows} steps launch {kernels} kernels whose median runs "
                    f"{median_ns / 1000:.1f} us, while the device is idle {fmt_ms(idle_ns)} of "
                    f"{fmt_ms(step_ns)}: the host's per-op dispatch, not the device, sets the "
                    "step time."
                    + (
                        " On the neuron device each eager op is a separate launch."
                        if neuron
                        else ""
                    )
                ),
                saving_ns=idle_ns * self.RECOVERABLE_SHARE,
                fix=advice(state, neuron, unfused, b.num_rows),
                evidence=Evidence(
                    event_ids=longest_ids(ctx, where),
                    ops=top_ops(ctx, where, by="count"),  # the ops that launch the most
                    source_lines=top_lines(ctx, where, by="count"),
                    metrics={
                        "steps": b.num_rows,
                        "kernels": kernels,
                        "median_kernel_ns": median_ns,
                        "idle_ns": idle_ns,
                        "idle_share": round(idle_ns / step_ns, 4),
                        "graph_kernels": state.graph_kernels,
                        "eager_kernels": state.eager_kernels,
                        "graphs_per_step": state.graphs_per_step,
                        "recompiles": state.recompiles,
                    },
                ),
            )
        ]


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

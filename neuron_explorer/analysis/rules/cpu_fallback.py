"""cpu-fallback: ops that left the neuron device and ran on the CPU."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, longest_ids, top_lines, top_ops

WHERE = "layer = 'host' AND kind = 'fallback'"
# the device sync and the copies out and back that each fallback call costs: the runtime
# records them with the fallback's op and call site
AROUND = (
    "layer = 'host' AND (name = 'sync' OR (kind = 'copy' AND json_extract_string(args, "
    "'$.direction') IS NULL)) AND (op_name, src_file, src_line) IN "
    f"(SELECT (op_name, src_file, src_line) FROM ev WHERE {WHERE})"
)


@dataclass(frozen=True)
class Fallbacks:
    calls: int
    ops: int  # distinct ops that fell back
    ns: int  # the fallbacks' time with their syncs and copies


class CpuFallback(Rule[Fallbacks]):
    """Ops outside the device's supported set run on the CPU.

    Pattern: an op the neuron runtime does not implement falls back to the CPU: its inputs are
    copied to the host, it runs there, and its outputs are copied back, every call.
    Algorithm: the host events of kind fallback (one per fallback call; op_name names the op,
    src_file/src_line the call site) plus the device sync and the copies out and back recorded
    with the same op and call site. Report when there are at least MIN_FALLBACKS. The saving is
    a replay of the op back on the device with no cost of its own: the fallbacks' and their
    copies' host time removed and their syncs dropped (an upper bound: the op's own kernel,
    not in the profile, would cost something).
    """

    id = "cpu-fallback"
    title = "Ops fall back to the CPU"
    severity = "high"
    scope = "neuron"
    category = "readiness"
    MIN_FALLBACKS = 1
    fix = (
        "Replace the op with supported ones at the lines shown (e.g. boolean-mask indexing with "
        "torch.where, nonzero with a fixed-size mask), or move it out of the step; "
        "torch.neuron.get_fallback_ops() lists what fell back."
    )

    def measure(self, ctx: AnalysisContext) -> Fallbacks | None:
        agg = ctx.one(
            f"""SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns,
                   count(DISTINCT coalesce(op_name, name)) AS ops FROM ev WHERE {WHERE}"""
        )
        n = int(agg.get("n") or 0)
        if n == 0:
            return None
        # the device sync and the copies out and back that each fallback call costs: the
        # runtime records them with the fallback's op and call site
        around = ctx.one(f"SELECT coalesce(sum(dur_ns), 0) AS ns FROM ev WHERE {AROUND}")
        ns = int(agg.get("ns") or 0) + int(around.get("ns") or 0)
        return Fallbacks(n, int(agg["ops"]), ns)

    def gate(self, facts: Fallbacks) -> bool:
        return facts.calls >= self.MIN_FALLBACKS

    def evidence(self, ctx: AnalysisContext, facts: Fallbacks) -> Evidence:
        return Evidence(
            event_ids=longest_ids(ctx, WHERE),
            ops=top_ops(ctx, WHERE),
            source_lines=top_lines(ctx, WHERE),
            metrics={"fallback_calls": facts.calls, "fallback_ns": facts.ns, "ops": facts.ops},
        )

    def explain(self, facts: Fallbacks, evidence: Evidence) -> Draft:
        n, ns = facts.calls, facts.ns
        names = ", ".join(o.label for o in evidence.ops[:3])
        return Draft(
            title=f"{facts.ops} op(s) fell back to the CPU {n} times ({names}), {fmt_ms(ns)}",
            detail=(
                f"{n} calls ran on the CPU instead of the device, with their inputs and "
                f"outputs copied across each time: {fmt_ms(ns)} in all. Until they are "
                "replaced the model is not fully on the device."
            ),
            saving_ns=ns,
            evidence=evidence,
            change=Replayed(
                f"these {n} fallbacks, their copies and syncs removed (the op on the device "
                "counted free: an upper bound)",
                f"({WHERE}) OR (({AROUND}) AND kind <> 'sync')",
                "remove_host",
                then=(Replayed("", f"({AROUND}) AND kind = 'sync'", "drop_syncs"),),
            ),
        )

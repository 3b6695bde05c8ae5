"""float64-downcast: float64 tensors silently run as float32 on the device."""

from __future__ import annotations

from dataclasses import dataclass

from ..context import AnalysisContext
from ..conventions import DOWNCAST_PREDICATE
from ..findings import Evidence
from ..rule import Draft, Rule, longest_ids, top_lines, top_ops

WHERE = DOWNCAST_PREDICATE


@dataclass(frozen=True)
class Downcasts:
    calls: int  # float64 op calls run as float32


class Float64Downcast(Rule[Downcasts]):
    """float64 work the device runs as float32.

    Pattern: the neuron device has no float64 arithmetic; ops on float64 tensors run as
    float32 (with a warning), so results differ from a CPU float64 run and the extra casts
    cost time.
    Algorithm: neuron kernels whose input dtypes include float64 (the device runs them as
    float32), and any runtime event named "downcast" (args {"from": "float64", "to":
    "float32"}); op_name is the op, src_file/src_line the call site. Report when there are at least
    MIN_DOWNCASTS; this is a correctness finding, so no time saving is claimed.
    """

    id = "float64-downcast"
    title = "float64 runs as float32 on the device"
    severity = "medium"
    scope = "neuron"
    category = "readiness"
    MIN_DOWNCASTS = 1
    fix = (
        "Make the dtype explicit at the lines shown: create tensors as float32 "
        "(torch.tensor(..., dtype=torch.float32), numpy arrays via .astype('float32')) or call "
        ".float() before moving them to the device."
    )

    def measure(self, ctx: AnalysisContext) -> Downcasts:
        return Downcasts(int(ctx.one(f"SELECT count(*) AS n FROM ev WHERE {WHERE}").get("n") or 0))

    def gate(self, facts: Downcasts) -> bool:
        return facts.calls >= self.MIN_DOWNCASTS

    def evidence(self, ctx: AnalysisContext, facts: Downcasts) -> Evidence:
        return Evidence(
            event_ids=longest_ids(ctx, WHERE),
            ops=top_ops(ctx, WHERE),
            source_lines=top_lines(ctx, WHERE),
            metrics={"downcasts": facts.calls},
        )

    def explain(self, facts: Downcasts, evidence: Evidence) -> Draft:
        n = facts.calls
        return Draft(
            title=f"{n} float64 op call(s) ran as float32 "
            f"({', '.join(o.label for o in evidence.ops[:3])})",
            detail=(
                f"{n} op calls received float64 tensors and ran them as float32 on the "
                "device. Numbers can differ from a float64 CPU run; make the dtype explicit "
                "so the result does not depend on the device."
            ),
            saving_ns=0,
            evidence=evidence,
        )

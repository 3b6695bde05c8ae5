"""What a profile shows about torch.compile for its model: whether a compiled step ran, how many
graphs a step runs (more than one means graph breaks), and whether it recompiled. Advice that
says "use torch.compile" reads this first, so it only claims what the profile shows works."""

from __future__ import annotations

from dataclasses import dataclass

from .context import AnalysisContext
from .conventions import COMPILE_GROUP_SQL, KERNEL_KINDS, PROGRAM_SQL, sql_list

# kernels of a compiled graph: the neuron backend's programs, inductor's triton kernels (GPU)
GRAPH_KERNEL_SQL = (
    "(coalesce(op_name, '') LIKE 'neuron_graph_%' OR name LIKE 'triton\\_%' ESCAPE '\\')"
)
# torch.compile's span around each call of a compiled frame ("Torch-Compiled Region: 0/0")
COMPILED_REGION_LIKE = "Torch-Compiled Region%"


@dataclass(frozen=True)
class CompileState:
    """graph_kernels / eager_kernels: device kernels in the steps from compiled graphs / eager
    ops; graphs_per_step: the most compiled graphs (or compiled-region calls) one step runs;
    recompiles: programs compiled again for new shapes."""

    graph_kernels: int
    eager_kernels: int
    graphs_per_step: int
    recompiles: int

    @property
    def compiled(self) -> bool:
        return self.graph_kernels > 0 or self.graphs_per_step > 0


def compile_state(ctx: AnalysisContext) -> CompileState:
    """The compile facts of a profile, from its kernels, torch.compile's spans and recompiles."""
    kernels = ctx.events_of(KERNEL_KINDS, "device")
    in_steps = "step IS NOT NULL" if ctx.has_steps else "TRUE"
    k = ctx.one(
        f"""SELECT count(*) FILTER (WHERE {GRAPH_KERNEL_SQL}) AS graph,
               count(*) FILTER (WHERE NOT {GRAPH_KERNEL_SQL}) AS eager
        FROM {kernels} WHERE layer = 'device' AND kind IN {sql_list(KERNEL_KINDS)}
             AND {in_steps}"""
    )
    per_step = ctx.one(
        f"""WITH g AS (SELECT step, count(DISTINCT {COMPILE_GROUP_SQL}) AS n FROM {kernels}
                       WHERE layer = 'device' AND coalesce(op_name, '') LIKE 'neuron_graph_%'
                       GROUP BY step
                       UNION ALL
                       SELECT step, count(*) AS n FROM ev
                       WHERE layer = 'host' AND name LIKE '{COMPILED_REGION_LIKE}'
                       GROUP BY step)
        SELECT coalesce(max(n), 0) AS n FROM g"""
    )
    ctx.ensure_recompiles()
    rec = ctx.one(f"SELECT count(DISTINCT {PROGRAM_SQL}) AS n FROM recompiles")
    return CompileState(
        graph_kernels=int(k.get("graph") or 0),
        eager_kernels=int(k.get("eager") or 0),
        graphs_per_step=int(per_step.get("n") or 0),
        recompiles=int(rec.get("n") or 0),
    )

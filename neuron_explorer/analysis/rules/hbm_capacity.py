"""hbm-capacity: the step needs more device memory than one chip's HBM holds."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..context import AnalysisContext
from ..findings import Evidence, Hotspot
from ..memory import memory_page
from ..readiness import DeviceMemory, device_memory
from ..rule import Draft, Rule

_GIB = 1 << 30
STATE = ("parameters", "gradients", "optimizer state")  # what FSDP2 shards


@dataclass(frozen=True)
class Capacity:
    memory: DeviceMemory
    fsdp_ranks: int | None  # ranks FSDP2 needs for the state to fit beside the activations
    tp_degree: int  # the power of two that divides the whole peak below the HBM


def _gib(n: float) -> str:
    return f"{n / _GIB:,.1f} GiB"


def _held_at_peak(
    ctx: AnalysisContext, limit: int = 5
) -> tuple[tuple[Hotspot, ...], tuple[Hotspot, ...]]:
    """The source lines and the modules whose allocations the peak held most of
    (analysis/memory.py's split of the step's growth to the peak), each with its share."""
    with ctx.lock:
        peak = memory_page(ctx.profile, ctx.profile.duckdb()).peak
    lines = tuple(
        Hotspot(f"{r['file']}:{r['line']}", 0, 0, r["file"], int(r["line"]),
                note=f"holds {_gib(float(r['held_bytes']))} at the peak ({r.get('op') or ''})")
        for r in ((peak or {}).get("by_line") or [])[:limit]
        if r.get("held_bytes") and float(r["held_bytes"]) > 0
    )  # fmt: skip
    modules = tuple(
        Hotspot(str(r["module"]), 0, 0, note=f"holds {_gib(float(r['held_bytes']))} at the peak")
        for r in ((peak or {}).get("by_module") or [])[:limit]
        if r.get("held_bytes") and float(r["held_bytes"]) > 0
    )
    return lines, modules


class HbmCapacity(Rule[Capacity]):
    """The peak of device memory exceeds the chip's HBM: the step would not run.

    Pattern: a rank's parameters, gradients, optimizer state and activations together need
    more than the HBM of the chip it runs on (trn1 32 GiB, trn2 96 GiB, trn3 144 GiB per chip,
    each with its source in the spec): on Trainium the step fails with an out-of-memory error.
    Shapes-only mode (docs/device.md) measures this for a full-size model on any host.
    Algorithm: the peak is the higher of the manifest's `device_memory.peak_bytes` and the
    device's `memory_allocated` counter's maximum on any rank; the capacity is the manifest's
    device spec `hbm_bytes`. Report when the peak exceeds it, with the source lines and
    the modules whose allocations the peak held most of. The fix names the FSDP2 ranks
    that bring parameters, gradients and optimizer state (which FSDP2 shards) below the HBM
    left beside the unsharded rest, and the tensor-parallel degree (a power of two) that
    divides the whole peak below it. A correctness finding: no time saving is claimed.
    """

    id = "hbm-capacity"
    title = "The step does not fit the chip's HBM"
    severity = "high"
    scope = "neuron"
    category = "readiness"
    fix = (
        "Shard the model: FSDP2 (torch.distributed.fsdp.fully_shard) over the ranks shown "
        "splits parameters, gradients and optimizer state; tensor parallelism (DTensor) of the "
        "degree shown splits activations too. Activation checkpointing and bf16 weights also "
        "lower the peak."
    )

    def measure(self, ctx: AnalysisContext) -> Capacity | None:
        mem = device_memory(ctx)
        if mem is None or not mem.capacity_bytes:
            return None
        cap = mem.capacity_bytes
        state = sum(b for role, b in mem.held_bytes if role in STATE)
        rest = mem.peak_bytes - state
        fsdp = math.ceil(state / (cap - rest)) if state and rest < cap else None
        tp = 1 << max(0, math.ceil(math.log2(mem.peak_bytes / cap)))
        return Capacity(mem, fsdp, tp)

    def gate(self, facts: Capacity) -> bool:
        return facts.memory.fits is False

    def evidence(self, ctx: AnalysisContext, facts: Capacity) -> Evidence:
        mem = facts.memory
        metrics: dict[str, float] = {
            "peak_bytes": mem.peak_bytes,
            "hbm_bytes": mem.capacity_bytes or 0,
            "tp_degree": facts.tp_degree,
        }
        if facts.fsdp_ranks:
            metrics["fsdp_ranks"] = facts.fsdp_ranks
        metrics.update({f"{role.replace(' ', '_')}_bytes": b for role, b in mem.held_bytes})
        lines, modules = _held_at_peak(ctx)
        return Evidence(source_lines=lines, metrics=metrics, modules=modules)

    def explain(self, facts: Capacity, evidence: Evidence) -> Draft:
        mem = facts.memory
        chip = mem.chip or "the chip"
        held = ", ".join(f"{role} {_gib(b)}" for role, b in mem.held_bytes if b)
        how = f"TP={facts.tp_degree}"
        if facts.fsdp_ranks:
            how = f"FSDP2 over {facts.fsdp_ranks} ranks or {how}"
        return Draft(
            title=(
                f"needs {_gib(mem.peak_bytes)} on one NeuronCore group; the {chip} chip has "
                f"{_gib(mem.capacity_bytes or 0)}: shard with {how}"
            ),
            detail=(
                f"The device memory peaked at {_gib(mem.peak_bytes)}"
                + (f" ({held})" if held else "")
                + f", over the {_gib(mem.capacity_bytes or 0)} of HBM one {chip} chip has "
                f"({mem.capacity_source or 'the device spec'}). On Trainium this step fails "
                "with an out-of-memory error."
            ),
            saving_ns=0,
            evidence=evidence,
        )

"""host-device-copies: pageable or per-step host/device copies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..context import AnalysisContext
from ..conventions import NEURON_COPY_KIND
from ..findings import Evidence
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, hotspots, longest_ids, top_lines, top_ops

# GPU copies between host and device, by Kineto's memcpy names ("Memcpy HtoD (Pageable -> ...)").
GPU_HOST_COPY = "kind = 'gpu_memcpy' AND (name LIKE '%HtoD%' OR name LIKE '%DtoH%')"
NEURON_H2D = (
    f"kind = '{NEURON_COPY_KIND}' AND layer = 'host' "
    "AND json_extract_string(args, '$.direction') = 'h2d'"
)


NEURON_PER_STEP = f"{NEURON_H2D} AND step IS NOT NULL"


@dataclass(frozen=True)
class Copies:
    steps: int  # at least 1
    step_ns: int
    gpu: int  # GPU host/device copies
    gpu_ns: int
    pageable: int  # of them from pageable memory
    pageable_ns: int
    lines: tuple[dict[str, Any], ...]  # neuron lines copying in (nearly) every step

    @property
    def lines_ns(self) -> int:
        return sum(int(r["dur_ns"]) for r in self.lines)


class HostDeviceCopies(Rule[Copies]):
    """Copies between host and device that pageable memory or per-step tensor creation cause.

    Pattern: (GPU) copies from pageable host memory go through a staging buffer and block the
    host; many small host/device copies per step add up. (Neuron) tensors created on the host
    and moved to the device at the same line in every step (torch.tensor(...).to("neuron"),
    masks or constants rebuilt in the loop).
    Algorithm: GPU: gpu_memcpy events named HtoD/DtoH; report pageable ones when there are at
    least MIN_PAGEABLE_COPIES, and all of them when there are at least MIN_COPIES_PER_STEP per
    step taking at least MIN_SHARE of step time. Neuron: host copy events with direction h2d,
    grouped by source line; report lines that copy in at least EVERY_STEP_FRACTION of the steps
    (with at least two steps) when those copies take at least MIN_SHARE of step time. The
    saving is a replay: the pageable copies' device time cut by PINNED_SAVING; frequent GPU
    copies at no time; the per-step neuron copies gone from the host (and no longer waited
    for), so a copy the host overlaps with other work saves less than its time.
    """

    id = "host-device-copies"
    title = "Host/device copies in the step"
    severity = "low"
    MIN_PAGEABLE_COPIES = 1
    MIN_COPIES_PER_STEP = 8
    MIN_SHARE = 0.02
    EVERY_STEP_FRACTION = 0.8
    PINNED_SAVING = 0.5  # pinned copies run about twice as fast and do not block the host
    fix = (
        "Create tensors on the device (torch.zeros(..., device=dev), torch.arange(..., "
        "device=dev)) and build constants once outside the loop; for input batches use "
        "DataLoader(pin_memory=True) and .to(dev, non_blocking=True)."
    )

    def measure(self, ctx: AnalysisContext) -> Copies:
        steps = max(ctx.steps().num_rows, 1)
        g = ctx.one(
            f"""SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns,
                   count(*) FILTER (WHERE name LIKE '%Pageable%') AS pn,
                   coalesce(sum(dur_ns) FILTER (WHERE name LIKE '%Pageable%'), 0) AS pns
            FROM {ctx.events_of(("gpu_memcpy",))} WHERE {GPU_HOST_COPY}"""
        )
        lines: list[dict[str, Any]] = []
        if ctx.has_steps and steps >= 2:
            lines = ctx.rows(
                f"""SELECT src_file AS file, src_line AS line, any_value(src_func) AS func,
                       src_file || ':' || src_line AS label, count(DISTINCT step) AS steps,
                       count(*) AS count, sum(dur_ns) AS dur_ns,
                       sum(coalesce(bytes_written, bytes_read, 0)) AS bytes
                FROM {ctx.events_of((NEURON_COPY_KIND,), "host")}
                WHERE {NEURON_H2D} AND step IS NOT NULL AND src_file IS NOT NULL
                GROUP BY src_file, src_line
                HAVING count(DISTINCT step) >= {self.EVERY_STEP_FRACTION} * {steps}
                ORDER BY dur_ns DESC, file, line"""
            )
        n, ns, pn, pns = (int(g.get(k) or 0) for k in ("n", "ns", "pn", "pns"))
        return Copies(steps, ctx.total_step_ns, n, ns, pn, pns, tuple(lines))

    def frequent(self, f: Copies) -> bool:
        """Many GPU copies per step, taking a share of the step."""
        return (
            f.step_ns > 0
            and f.gpu >= self.MIN_COPIES_PER_STEP * f.steps
            and f.gpu_ns >= self.MIN_SHARE * f.step_ns
        )

    def gpu_found(self, f: Copies) -> bool:
        return self.frequent(f) or f.pageable >= self.MIN_PAGEABLE_COPIES

    def lines_found(self, f: Copies) -> bool:
        return bool(f.lines) and f.lines_ns >= self.MIN_SHARE * f.step_ns

    def gate(self, facts: Copies) -> bool:
        return self.gpu_found(facts) or self.lines_found(facts)

    def gpu_where(self, f: Copies) -> str:
        return GPU_HOST_COPY if self.frequent(f) else f"{GPU_HOST_COPY} AND name LIKE '%Pageable%'"

    def evidence(self, ctx: AnalysisContext, facts: Copies) -> tuple[Evidence | None, ...]:
        """One Evidence for the GPU finding and one for the neuron lines (None when absent)."""
        gpu = line = None
        if self.gpu_found(facts):
            where = self.gpu_where(facts)
            ops = ctx.rows(
                f"""SELECT name AS label, sum(dur_ns) AS dur_ns, count(*) AS count
                FROM ev WHERE {where} GROUP BY 1 ORDER BY dur_ns DESC, label LIMIT 5"""
            )
            gpu = Evidence(
                event_ids=longest_ids(ctx, where),
                ops=hotspots(ops),
                source_lines=top_lines(ctx, where),
                metrics={
                    "copies": facts.gpu, "copy_ns": facts.gpu_ns, "pageable": facts.pageable,
                    "pageable_ns": facts.pageable_ns, "steps": facts.steps,
                },
            )  # fmt: skip
        if self.lines_found(facts):
            line = Evidence(
                event_ids=longest_ids(ctx, NEURON_PER_STEP),
                ops=top_ops(ctx, NEURON_PER_STEP),
                source_lines=hotspots(list(facts.lines), note="bytes"),
                metrics={
                    "lines": len(facts.lines),
                    "copy_ns": facts.lines_ns,
                    "steps": facts.steps,
                },
            )
        return gpu, line

    def explain(self, facts: Copies, evidence: tuple[Evidence | None, ...]) -> list[Draft]:
        gpu, line = evidence
        out = []
        if gpu is not None:
            out.append(self._explain_gpu(facts, gpu))
        if line is not None:
            out.append(
                Draft(
                    title=f"{len(facts.lines)} line(s) copy host tensors to the device in "
                    f"every step ({fmt_ms(facts.lines_ns)})",
                    detail=(
                        "These lines create a tensor on the host and move it to the device "
                        "in (nearly) every step; each move is a host-to-device DMA the step "
                        "waits for. The saving counts the copies only: building the tensor "
                        "on the host each step costs more host time on top, which the "
                        "profile does not attribute to the line."
                    ),
                    saving_ns=facts.lines_ns,
                    evidence=line,
                    change=Replayed(
                        f"these lines' {sum(int(r['count']) for r in facts.lines)} copies "
                        "removed (the tensors built once, on the device)",
                        self.lines_where(facts),
                        "remove_host",
                        then=(Replayed("", self.lines_where(facts), "drop_syncs"),),
                    ),
                )
            )
        return out

    def lines_where(self, f: Copies) -> str:
        """The per-step copies of the lines found, as an SQL condition over `ev`."""
        keys = ", ".join(
            f"('{str(r['file']).replace(chr(39), chr(39) * 2)}', {int(r['line'])})" for r in f.lines
        )
        return f"{NEURON_PER_STEP} AND (src_file, src_line) IN ({keys})"

    def _explain_gpu(self, f: Copies, evidence: Evidence) -> Draft:
        frequent = self.frequent(f)
        what = (
            f"{f.gpu} host/device copies ({fmt_ms(f.gpu_ns)})"
            if frequent
            else f"{f.pageable} copies from pageable host memory ({fmt_ms(f.pageable_ns)})"
        )
        return Draft(
            title=f"{what} over {f.steps} step(s)",
            detail=(
                f"The trace has {f.gpu} copies between host and device taking "
                f"{fmt_ms(f.gpu_ns)}, {f.pageable} of them from pageable memory, which the "
                "driver stages through a pinned buffer while the host waits."
            ),
            saving_ns=f.gpu_ns if frequent else f.pageable_ns * self.PINNED_SAVING,
            evidence=evidence,
            change=Replayed(
                f"these {f.gpu} copies removed"
                if frequent
                else f"these {f.pageable} copies {1 / (1 - self.PINNED_SAVING):g}x faster (pinned)",
                self.gpu_where(f),
                "set" if frequent else "scale",
                factor=1 / (1 - self.PINNED_SAVING),
                dur_sql="0" if frequent else None,
            ),  # fmt: skip
        )

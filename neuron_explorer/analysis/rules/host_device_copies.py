"""host-device-copies: pageable or per-step host/device copies."""

from __future__ import annotations

from ..context import AnalysisContext
from ..conventions import NEURON_COPY_KIND
from ..findings import Evidence, Finding
from ..rule import Rule, fmt_ms, hotspots, longest_ids, register, top_lines, top_ops

# GPU copies between host and device, by Kineto's memcpy names ("Memcpy HtoD (Pageable -> ...)").
GPU_HOST_COPY = "kind = 'gpu_memcpy' AND (name LIKE '%HtoD%' OR name LIKE '%DtoH%')"
NEURON_H2D = (
    f"kind = '{NEURON_COPY_KIND}' AND layer = 'host' "
    "AND json_extract_string(args, '$.direction') = 'h2d'"
)


@register
class HostDeviceCopies(Rule):
    """Copies between host and device that pageable memory or per-step tensor creation cause.

    Pattern: (GPU) copies from pageable host memory go through a staging buffer and block the
    host; many small host/device copies per step add up. (Neuron) tensors created on the host
    and moved to the device at the same line in every step (torch.tensor(...).to("neuron"),
    masks or constants rebuilt in the loop).
    Algorithm: GPU: gpu_memcpy events named HtoD/DtoH; report pageable ones when there are at
    least MIN_PAGEABLE_COPIES, and all of them when there are at least MIN_COPIES_PER_STEP per
    step taking at least MIN_SHARE of step time. Neuron: host copy events with direction h2d,
    grouped by source line; report lines that copy in at least EVERY_STEP_FRACTION of the steps
    (with at least two steps) when those copies take at least MIN_SHARE of step time. Saving:
    PINNED_SAVING of pageable copy time; the whole time of
    per-step neuron copies and of frequent GPU copies.
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

    def check(self, ctx: AnalysisContext) -> list[Finding]:
        out = []
        steps = max(ctx.steps().num_rows, 1)
        step_ns = ctx.total_step_ns
        g = ctx.one(
            f"""SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns,
                   count(*) FILTER (WHERE name LIKE '%Pageable%') AS pn,
                   coalesce(sum(dur_ns) FILTER (WHERE name LIKE '%Pageable%'), 0) AS pns
            FROM {ctx.events_of(("gpu_memcpy",))} WHERE {GPU_HOST_COPY}"""
        )
        n, ns, pn, pns = (int(g.get(k) or 0) for k in ("n", "ns", "pn", "pns"))
        frequent = (
            step_ns > 0 and n >= self.MIN_COPIES_PER_STEP * steps and ns >= self.MIN_SHARE * step_ns
        )
        if frequent or pn >= self.MIN_PAGEABLE_COPIES:
            where = GPU_HOST_COPY if frequent else f"{GPU_HOST_COPY} AND name LIKE '%Pageable%'"
            saving = ns if frequent else pns * self.PINNED_SAVING
            what = (
                f"{n} host/device copies ({fmt_ms(ns)})"
                if frequent
                else (f"{pn} copies from pageable host memory ({fmt_ms(pns)})")
            )
            out.append(
                self.finding(
                    ctx,
                    title=f"{what} over {steps} step(s)",
                    detail=(
                        f"The trace has {n} copies between host and device taking {fmt_ms(ns)}, "
                        f"{pn} of them from pageable memory, which the driver stages through a "
                        "pinned buffer while the host waits."
                    ),
                    saving_ns=saving,
                    evidence=Evidence(
                        event_ids=longest_ids(ctx, where),
                        ops=hotspots(
                            ctx.rows(
                                f"""SELECT name AS label, sum(dur_ns) AS dur_ns, count(*) AS count
                            FROM ev WHERE {where} GROUP BY 1 ORDER BY dur_ns DESC LIMIT 5"""
                            )
                        ),
                        source_lines=top_lines(ctx, where),
                        metrics={
                            "copies": n,
                            "copy_ns": ns,
                            "pageable": pn,
                            "pageable_ns": pns,
                            "steps": steps,
                        },
                    ),
                )
            )
        if ctx.has_steps and steps >= 2:
            per_line = ctx.rows(
                f"""SELECT src_file AS file, src_line AS line, any_value(src_func) AS func,
                       src_file || ':' || src_line AS label, count(DISTINCT step) AS steps,
                       count(*) AS count, sum(dur_ns) AS dur_ns,
                       sum(coalesce(bytes_written, bytes_read, 0)) AS bytes
                FROM {ctx.events_of((NEURON_COPY_KIND,), "host")}
                WHERE {NEURON_H2D} AND step IS NOT NULL AND src_file IS NOT NULL
                GROUP BY src_file, src_line
                HAVING count(DISTINCT step) >= {self.EVERY_STEP_FRACTION} * {steps}
                ORDER BY dur_ns DESC"""
            )
            ns = sum(int(r["dur_ns"]) for r in per_line)
            if per_line and ns >= self.MIN_SHARE * step_ns:
                where = f"{NEURON_H2D} AND step IS NOT NULL"
                out.append(
                    self.finding(
                        ctx,
                        title=f"{len(per_line)} line(s) copy host tensors to the device in "
                        f"every step ({fmt_ms(ns)})",
                        detail=(
                            "These lines create a tensor on the host and move it to the device "
                            "in (nearly) every step; each move is a host-to-device DMA the step "
                            "waits for. The saving counts the copies only: building the tensor "
                            "on the host each step costs more host time on top, which the "
                            "profile does not attribute to the line."
                        ),
                        saving_ns=ns,
                        evidence=Evidence(
                            event_ids=longest_ids(ctx, where),
                            ops=top_ops(ctx, where),
                            source_lines=hotspots(per_line, note="bytes"),
                            metrics={"lines": len(per_line), "copy_ns": ns, "steps": steps},
                        ),
                    )
                )
        return out

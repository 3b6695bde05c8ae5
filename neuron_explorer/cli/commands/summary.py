"""`neuron-explorer summary PROFILE`: devices, steps, where the step time went, top ops."""

from __future__ import annotations

import argparse

NAME = "summary"
HELP = (
    "Print a profile's devices, steps, step-time breakdown, top host ops and device kernels, "
    "engine utilization, MFU/MBU and (neuron) the readiness block."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--top", type=int, default=10, help="rows in the top tables (10)")


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis import summarize
    from ..scope import open_analysed

    profile = open_analysed(args.profile, args.json)
    summary = summarize(profile)
    where = hotspots_of(profile, args.top)
    if args.json:
        print(json.dumps({**summary.to_dict(), **where}, indent=2, default=str))
        return 0
    render_summary(summary, top=args.top)
    render_hotspots(where)
    return 0


def hotspots_of(profile, top: int) -> dict:
    """The top modules and top model lines by device self time (analysis/hotspots.py)."""
    from ...analysis.hotspots import top_lines, top_modules

    con = profile.duckdb()
    return {"top_modules": top_modules(profile, top, con),
            "top_model_lines": top_lines(profile, "model", top, con)}  # fmt: skip


def render_hotspots(where: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from .lines import _short

    c = Console()
    for title, rows, key in (
        ("Top modules by device self time (neuron-explorer modules)", where["top_modules"],
         "label"),
        ("Top model lines by device self time (neuron-explorer lines)",
         where["top_model_lines"], "file"),
    ):  # fmt: skip
        if not rows:
            continue
        t = Table(title=title, title_justify="left")
        for h in ("where", "self", "total"):
            t.add_column(h, justify="left" if h == "where" else "right", overflow="fold")
        for r in rows:
            name = r[key] if key == "label" else f"{_short(r['file'])}:{r['line']} ({r['func']})"
            t.add_row(name, _ms(r["self_ns"]), _ms(r["total_ns"]))
        c.print(t)


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.3f} ms"


def _cell(column: str, value: object) -> str:
    if value is None:
        return ""
    if column.endswith("_ns"):
        return _ms(value)  # type: ignore[arg-type]
    if isinstance(value, list):
        return "; ".join(str(v) for v in value[:5])
    return str(value)


def run_ended_line(e: dict) -> str:
    """One line for a run that an exception ended: what, in which op, at which user line."""
    where = f" in {e['op']}" if e.get("op") else ""
    if e.get("file"):
        where += f" at {e['file']}:{e['line']}"
    return (
        f"Run ended early by {e.get('exception')}: {e.get('message')}{where}; the profile "
        "holds only what ran before it (the last step is partial)"
    )


def _pct(part: float | None, whole: float) -> str:
    return "-" if part is None or not whole else f"{100 * part / whole:.1f}%"


def render_summary(s, top: int = 10) -> None:  # analysis.Summary
    from rich.console import Console
    from rich.markup import escape

    from ..tables import wrap_parts

    c = Console()
    head = [f"[bold]{s.profile}[/]  source {s.source}", f"ranks {list(s.ranks)}",
            f"{s.n_events:,} events", f"wall {_ms(s.wall_ns)}"]  # fmt: skip
    c.print(wrap_parts(c.width, head), highlight=False, soft_wrap=True)
    if s.job_ending is not None and len(s.ranks) + len(s.job_ending.missing_ranks) > 1:
        for line in s.job_ending.lines():
            c.print(f"[bold red]{escape(line)}[/]", highlight=False)
    elif s.run_ended:
        c.print(f"[bold red]{escape(run_ended_line(s.run_ended))}[/]", highlight=False)
    _render_steps(c, s.step_stats)
    if s.devices:
        _render_devices(c, s.devices)
        if s.ranks_table is not None:
            _render_ranks(c, s.ranks_table)
    _render_breakdown(c, s.breakdown, len(s.ranks))
    _render_top(c, s, top)
    if s.engines:
        from rich.table import Table

        t = Table(title="Engine utilization (busy over step time)", title_justify="left")
        for h in ("rank", "engine", "busy", "utilization"):
            t.add_column(h, justify="left" if h == "engine" else "right")
        for e in s.engines:
            t.add_row(str(e.rank), e.engine, _ms(e.busy_ns), f"{100 * e.utilization:.2f}%")
        c.print(t)
    if s.mfu is not None or s.mbu is not None:
        mfu = "-" if s.mfu is None else f"{100 * s.mfu:.2f}%"
        mbu = "-" if s.mbu is None else f"{100 * s.mbu:.2f}%"
        c.print(f"MFU {mfu} (TensorE FLOP/s over bf16 peak), MBU {mbu} (HBM bytes/s over peak)")
    if s.readiness is not None:
        _render_readiness(c, s.readiness, s.run_ended, top)


def _render_steps(c, st) -> None:  # analysis.steps.StepStats | None
    from ...analysis.steps import job_steps
    from ..tables import wrap_parts

    if not st:
        c.print("steps: none recorded (no ProfilerStep spans); the whole trace is one window")
        return
    per_step = [f"steps: {st.count}", f"time per step: mean {_ms(st.mean_ns)}",
                f"median {_ms(st.median_ns)}", f"min {_ms(st.min_ns)}", f"max {_ms(st.max_ns)}"]  # fmt: skip
    c.print(wrap_parts(c.width, per_step), highlight=False, soft_wrap=True)
    if st.left_out:
        c.print(
            f"  steady state: mean, median, min and max leave out each rank's first step "
            f"({len(st.left_out)} steps): the ranks started recording "
            f"{_ms(st.startup_skew_ns)} apart, and the first collective waits for the last",
            highlight=False,
        )
    for rank, step in st.partial_last_steps:
        c.print(
            f"  the last step (rank {rank}, step {step}) is partial: the profiler stopped "
            "during it; it is counted as recorded",
            highlight=False,
        )
    job = job_steps(st)
    if job is not None and job.ranks > 1:
        c.print(
            f"  the job's step (each step as long as its slowest rank, as diff and its gate "
            f"compare): median {_ms(job.median_ns)} over {job.count} whole steps",
            highlight=False,
        )


def _render_top(c, s, top: int) -> None:  # the top host ops and device kernels
    from ..tables import fit_table

    for title, table in (
        ("Top host ops by self time", s.top_ops_self),
        ("Top host ops by total time", s.top_ops_total),
    ):
        if table.num_rows:
            ops = [(r["name"], f"{r['calls']:,}", _ms(r["self_ns"]), _ms(r["total_ns"]))
                   for r in table.to_pylist()[:top]]  # fmt: skip
            op_heads = ("op", "calls", "self", "total")
            c.print(fit_table(c.width, op_heads, ops, title=title, right=(1, 2, 3)))
    if not s.top_kernels.num_rows:
        return
    heads = ("kernel", "device", "type", "calls", "total", "mean", "share")  # HTA's kernel types
    rows = [
        (
            r["name"],
            r["device"],
            {"communication": "comm"}.get(r.get("type") or "", r.get("type") or ""),
            f"{r['calls']:,}",
            _ms(r["total_ns"]),
            _ms(r["mean_ns"]),
            f"{100 * r['share']:.1f}%",
        )
        for r in s.top_kernels.to_pylist()[:top]
    ]
    c.print(fit_table(c.width, heads, rows, title="Top device kernels", right=range(3, 7)))


def _render_readiness(c, r, run_ended, top: int) -> None:  # analysis.readiness.Readiness
    from rich.markup import escape
    from rich.table import Table

    from ..tables import wrap_parts

    c.print("[bold]Trainium readiness[/]")
    if run_ended:  # "none" below means none before the run died
        c.print(f"  [bold red]{escape(run_ended_line(run_ended))}[/]", highlight=False)
    steady = "-" if r.steady_step_ns is None else _ms(r.steady_step_ns)
    timing = [f"  compile {_ms(r.compile_ns)}", f"first step {_ms(r.first_step_ns)} vs "
              f"steady {steady} (median of the rest)"]  # fmt: skip
    c.print(wrap_parts(c.width, timing, "; ", "    "), highlight=False, soft_wrap=True)
    if r.shapes_only:
        assumed = ", ".join(
            f"{op} x{n}" for op, n in r.shapes_only.get("assumed_shapes", {}).items()
        )
        uniform = ", ".join(
            f"{op} x{n}" for op, n in (r.shapes_only.get("uniform_routing") or {}).items()
        )
        c.print(f"  shapes-only mode: no numerics (placeholder values); data-dependent shapes "
                f"keep {r.shapes_only.get('fill_ratio')} of their elements"
                + (f" ({assumed})" if assumed else "")
                + (f"; one-hot masks (MoE routing) route uniformly ({uniform})" if uniform
                   else ""), highlight=False, soft_wrap=True)  # fmt: skip
    if r.model_ranks:
        copies = r.model_ranks.get("copies") or []
        span = f"{copies[0]}-{copies[-1]}" if len(copies) > 1 else ", ".join(map(str, copies))
        c.print(f"  modeled job of {r.model_ranks.get('world_size')} ranks: rank(s) "
                f"{', '.join(map(str, r.model_ranks.get('executed', [])))} executed, "
                f"{span or 'none'} copies", highlight=False)  # fmt: skip
    if r.device_memory is not None:
        c.print(wrap_parts(c.width, _memory_parts(r.device_memory), "; ", "    "),
                highlight=False, soft_wrap=True)  # fmt: skip
    for title, table in (
        ("CPU fallbacks", r.fallback_ops),
        ("float64 downcasts", r.downcasts),
        ("Recompiles", r.recompiles),
        ("Host syncs in the step", r.syncs),
    ):
        if not table.num_rows:
            c.print(f"  {title}: none")
            continue
        t = Table(title=f"  {title}", title_justify="left")
        for h in table.column_names:
            t.add_column(h, overflow="fold")
        for row in table.to_pylist()[:top]:
            t.add_row(*(_cell(k, v) for k, v in row.items()))
        c.print(t)


def _bytes(n: float) -> str:
    return f"{n / (1 << 30):,.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):,.1f} MiB"


def _memory_parts(m) -> list[str]:  # analysis.readiness.DeviceMemory
    head = f"  device memory peak {_bytes(m.peak_bytes)}"
    if m.capacity_bytes:
        verdict = "fits" if m.fits else "DOES NOT FIT"
        head += f" of {_bytes(m.capacity_bytes)} HBM ({m.chip} chip): {verdict}"
    return [head, *(f"{role} {_bytes(n)}" for role, n in m.held_bytes if n)]


def _render_devices(c, devices) -> None:
    from ..tables import fit_table

    heads = ("rank", "device", "kernels", "collectives", "transfers", "busy", "compute",
             "communication", "window", "idle in window", "busy share")  # fmt: skip
    rows = [
        (
            str(d.rank),
            d.device,
            f"{d.kernels:,}",
            f"{d.collectives:,}",
            f"{d.transfers:,}",
            _ms(d.busy_ns),
            _ms(d.compute_ns),
            _ms(d.communication_ns),
            _ms(d.window_ns),
            _ms(d.idle_ns),
            _pct(d.busy_ns, d.window_ns),
        )  # fmt: skip
        for d in devices
    ]
    c.print(fit_table(c.width, heads, rows, title="Devices", text=(1,), right=(0, *range(2, 11))))
    c.print(
        "  window: first to last device work, HTA's definition of idle; compute leaves "
        "communication (collectives, NCCL) out, as HTA does. The breakdown below counts inside "
        "the steps.",
        highlight=False,
    )


def _render_ranks(c, ranks) -> None:  # analysis.ranks.Ranks
    from ..tables import fit_table

    heads = ("rank", "steps", "median step", "compute", "communication", "wait", "device idle",
             "overlap")  # fmt: skip
    rows = [
        (
            str(r.rank),
            str(r.steps),
            _ms(r.median_step_ns),
            _ms(r.compute_ns),
            _ms(r.communication_ns),
            _ms(r.wait_ns),
            _ms(r.idle_ns),
            "-" if r.overlap is None else f"{100 * r.overlap:.0f}%",
        )  # fmt: skip
        for r in ranks.rows
    ]
    c.print(fit_table(c.width, heads, rows, title="Ranks (side by side, never summed)",
                      right=range(0, 8)))  # fmt: skip

    def x(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}x"

    sp = ranks.spread
    c.print(f"  spread across ranks (largest / smallest): median step {x(sp.median_step)}, "
            f"compute {x(sp.compute)}, wait {x(sp.wait)}; wait = time the rank's host was "
            "blocked while a collective waited for the last rank (never a sum); overlap = collective time under compute (HTA's comm/compute "
            "overlap)", highlight=False)  # fmt: skip


def _render_breakdown(c, b, n_ranks: int = 1) -> None:
    from rich.table import Table

    whose = f"the steps of all {n_ranks} ranks, added" if n_ranks > 1 else "all steps"
    t = Table(title=f"Step-time breakdown ({whose}; the parts add up to the steps)",
              title_justify="left")  # fmt: skip
    t.add_column("where")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    for p in b.parts:
        if p.ns or p.key == "device_compute_ns":  # the JSON keeps every part; zeros say nothing
            t.add_row(p.label, _ms(p.ns), _pct(p.ns, b.steps_ns))
    t.add_row("[bold]steps[/]", _ms(b.steps_ns), _pct(b.steps_ns, b.steps_ns))
    if b.overlap:
        t.add_section()
        for p in b.overlap:
            t.add_row(f"[dim]overlap, not added:[/] {p.label}", _ms(p.ns), _pct(p.ns, b.steps_ns))
    c.print(t)

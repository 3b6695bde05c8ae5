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
    from ...model.profile import Profile

    summary = summarize(Profile.open(args.profile))
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2, default=str))
        return 0
    render_summary(summary, top=args.top)
    return 0


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


def _pct(part: float | None, whole: float) -> str:
    return "-" if part is None or not whole else f"{100 * part / whole:.1f}%"


def render_summary(s, top: int = 10) -> None:  # analysis.Summary
    from rich.console import Console
    from rich.table import Table

    c = Console()
    c.print(
        f"[bold]{s.profile}[/]  source {s.source}, ranks {list(s.ranks)}, "
        f"{s.n_events:,} events, wall {_ms(s.wall_ns)}",
        highlight=False,
    )
    if s.step_stats:
        st = s.step_stats
        c.print(
            f"steps: {st.count}, time per step: mean {_ms(st.mean_ns)}, median "
            f"{_ms(st.median_ns)}, min {_ms(st.min_ns)}, max {_ms(st.max_ns)}",
            highlight=False,
        )
    else:
        c.print("steps: none recorded (no ProfilerStep spans); the whole trace is one window")
    if s.devices:
        t = Table(title="Devices", title_justify="left")
        for h in (
            "rank",
            "device",
            "kernels",
            "collectives",
            "transfers",
            "busy",
            "compute",
            "idle",
            "busy share",
        ):
            t.add_column(h, justify="right" if h not in ("device",) else "left")
        for d in s.devices:
            t.add_row(
                str(d.rank),
                d.device,
                f"{d.kernels:,}",
                f"{d.collectives:,}",
                f"{d.transfers:,}",
                _ms(d.busy_ns),
                _ms(d.compute_ns),
                _ms(d.idle_ns),
                _pct(d.busy_ns, d.window_ns),
            )
        c.print(t)
    b = s.breakdown
    t = Table(title="Step-time breakdown (all steps)", title_justify="left")
    t.add_column("where")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    device_rows = (
        ("device compute", b.device_compute_ns),
        ("DMA / copies only", b.dma_ns),
        ("device idle", b.device_idle_ns),
    )
    for label, v in (
        *(device_rows if b.device_compute_ns is not None else ()),  # none on CPU-only traces
        ("compile", b.compile_ns),
        ("CPU fallback", b.fallback_ns),
        ("sync wait", b.sync_ns),
        ("other host", b.host_other_ns),
    ):
        t.add_row(label, _ms(v), _pct(v, b.steps_ns))
    t.add_row("[bold]steps[/]", _ms(b.steps_ns), "")
    c.print(t)
    for title, table in (
        ("Top host ops by self time", s.top_ops_self),
        ("Top host ops by total time", s.top_ops_total),
    ):
        if table.num_rows:
            t = Table(title=title, title_justify="left")
            for h in ("op", "calls", "self", "total"):
                t.add_column(h, justify="left" if h == "op" else "right")
            for r in table.to_pylist()[:top]:
                t.add_row(r["name"][:80], f"{r['calls']:,}", _ms(r["self_ns"]), _ms(r["total_ns"]))
            c.print(t)
    if s.top_kernels.num_rows:
        t = Table(title="Top device kernels", title_justify="left")
        for h in ("kernel", "device", "calls", "total", "mean", "share"):
            t.add_column(h, justify="left" if h in ("kernel", "device") else "right")
        for r in s.top_kernels.to_pylist()[:top]:
            t.add_row(
                r["name"][:80],
                r["device"],
                f"{r['calls']:,}",
                _ms(r["total_ns"]),
                _ms(r["mean_ns"]),
                f"{100 * r['share']:.1f}%",
            )
        c.print(t)
    if s.engines:
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
    r = s.readiness
    if r is not None:
        c.print("[bold]Trainium readiness[/]")
        steady = "-" if r.steady_step_ns is None else _ms(r.steady_step_ns)
        c.print(
            f"  compile {_ms(r.compile_ns)}; first step {_ms(r.first_step_ns)} vs steady "
            f"{steady} (median of the rest)",
            highlight=False,
        )
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

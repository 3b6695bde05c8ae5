"""`neuron-explorer operators PROFILE`: framework ops by host self plus device time."""

from __future__ import annotations

import argparse

NAME = "operators"
HELP = (
    "Print the framework ops by host self time plus device time: calls, launches, FLOPs, "
    "bytes and arithmetic intensity (the web's operator page); --op NAME lists the kernels, "
    "instructions and source lines of one op."
)
TOP = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument("--op", metavar="NAME", default=None, help="one op's kernels and lines")
    parser.add_argument("--top", type=int, default=None,
                        help=f"rows shown ({TOP}; --json prints every op unless given)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis import stored
    from ...analysis.operators import operator_detail, operators, operators_page
    from ...analysis.page import is_modeled
    from ...errors import ExplorerError
    from ..scope import open_analysed

    if args.top is not None and args.top < 1:
        raise ExplorerError("operators: --top must be at least 1")
    profile = open_analysed(args.profile, args.json)
    if args.op is not None:
        detail = operator_detail(profile.duckdb(), args.op)
        if args.json:
            print(json.dumps(detail.to_dict(), indent=2, default=str))
        else:
            render_detail(detail, args.top or TOP)
        return 0
    top = args.top if args.json else None
    table = stored.load(profile, "ops_table")  # the import's, when current: the same table
    page = (operators(profile, top) if table is None else
            operators_page(table, profile.manifest.device_spec, is_modeled(profile), top))  # fmt: skip
    if args.json:
        print(json.dumps(page.to_dict(), indent=2, default=str))
        return 0
    render_operators(page, args.top or TOP)
    return 0


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.3f} ms"


def _si(v: float | None) -> str:
    if not v:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:,.1f}{unit}"
    return f"{v:,.0f}"


def render_operators(page, top: int) -> None:  # analysis.operators.Operators
    from rich.console import Console
    from rich.markup import escape

    from ..tables import fit_table

    c = Console()
    rows = [(escape(r["name"]), f"{r['count']:,}", _ms(r["host_self_ns"]), _ms(r["device_ns"]),
             f"{r['launches']:,}", _si(r["flops"]), _si(r["bytes"]),
             "-" if r["intensity"] is None else f"{r['intensity']:,.1f}")
            for r in page.operators[:top]]  # fmt: skip
    heads = ("op", "calls", "self", "device", "launches", "FLOPs", "bytes", "FLOP/B")
    where = " (device times modeled)" if page.device_time_modeled else ""
    title = f"Ops by host self time + device time{where}, {len(page.operators):,} in all"
    c.print(fit_table(c.width, heads, rows, title=title, right=range(1, 8)))
    if page.roofline is not None:
        r = page.roofline
        c.print(f"roofline: peak {_si(r.peak_flops_per_s)}FLOP/s, {_si(r.peak_bytes_per_s)}B/s "
                f"(ridge at {r.peak_flops_per_s / r.peak_bytes_per_s:,.1f} FLOP/B)",
                highlight=False)  # fmt: skip


def render_detail(detail, top: int) -> None:  # analysis.operators.OperatorDetail
    from rich.console import Console
    from rich.markup import escape

    from ..tables import fit_table
    from .lines import _short

    c = Console()
    if not (detail.kernels or detail.instructions or detail.lines):
        c.print(f"no op named {escape(detail.op)!r} launched work or ran at a source line")
        return
    for title, rows in (
        ("Kernels", detail.kernels),
        ("Instructions and DMAs", detail.instructions),
    ):
        if rows:
            cells = [(escape(r["name"]), r["track"] or "", f"{r['count']:,}", _ms(r["total_ns"]))
                     for r in rows[:top]]  # fmt: skip
            c.print(fit_table(c.width, ("name", "track", "count", "time"), cells,
                              title=f"{title} of {escape(detail.op)}", right=(2, 3)))  # fmt: skip
    if detail.lines:
        cells = [(escape(f"{_short(r['file'])}:{r['line']}"), escape(r["func"] or ""),
                  f"{r['count']:,}", _ms(r["total_ns"])) for r in detail.lines[:top]]  # fmt: skip
        c.print(fit_table(c.width, ("line", "function", "calls", "time"), cells,
                          title=f"Source lines of {escape(detail.op)}", text=(0, 1),
                          right=(2, 3)))  # fmt: skip

"""`neuron-explorer modules PROFILE`: device time down the nn.Module tree."""

from __future__ import annotations

import argparse

NAME = "modules"
HELP = (
    "Print device time by nn.Module path as a tree: self and total, forward and backward, "
    "calls (which layer costs what)."
)
NO_MODULES = (
    "no module paths in this profile (capture a model on the neuron device, or record the "
    "trace with with_modules=True)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument("--depth", type=int, default=None, help="deepest tree level shown")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis.hotspots import modules_page
    from ..scope import open_analysed

    page = modules_page(open_analysed(args.profile, args.json), depth=args.depth)
    if args.json:
        print(json.dumps(page.to_dict(), indent=2))
        return 0
    render_modules(page)
    return 0


def render_modules(page) -> None:  # analysis.hotspots.Modules
    from rich.console import Console
    from rich.markup import escape

    from ..tables import fit_table, wrap_parts

    c = Console()
    if not page.modules:
        c.print(wrap_parts(c.width, NO_MODULES.split(" "), " "), highlight=False)
        return
    rows = [("  " * m.depth + escape(m.path.rsplit(".", 1)[-1] if m.path else "(model)"),
             f"{m.calls:,}", _ms(m.self_ns), _ms(m.total_ns), _ms(m.forward_ns),
             _ms(m.backward_ns), f"{m.kernels:,}") for m in page.modules]  # fmt: skip
    heads = ("module", "calls", "self", "total", "forward", "backward", "kernels")
    title = "Device time by module (self: its own forward's work and its backward)"
    c.print(fit_table(c.width, heads, rows, title=title, right=range(1, 7)))


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.3f} ms"

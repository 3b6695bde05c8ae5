"""`neuron-explorer modules PROFILE`: device time down the nn.Module tree."""

from __future__ import annotations

import argparse

NAME = "modules"
HELP = (
    "Print device time by nn.Module path as a tree: self and total, forward and backward, "
    "calls (which layer costs what)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument("--depth", type=int, default=None, help="deepest tree level shown")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis.hotspots import module_tree
    from ...model.profile import Profile

    nodes = [
        m for m in module_tree(Profile.open(args.profile))
        if args.depth is None or m.depth <= args.depth
    ]  # fmt: skip
    if args.json:
        print(json.dumps({"modules": [m.to_dict() for m in nodes]}, indent=2))
        return 0
    if not nodes:
        print("no module paths in this profile (capture a model on the neuron device, or "
              "record the trace with with_modules=True)")  # fmt: skip
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Device time by module (self: its own forward's work and its backward)",
              title_justify="left")  # fmt: skip
    for h in ("module", "calls", "self", "total", "forward", "backward", "kernels"):
        t.add_column(
            h, justify="left" if h == "module" else "right", no_wrap=h != "module", overflow="fold"
        )
    for m in nodes:
        label = "  " * m.depth + (m.path.rsplit(".", 1)[-1] if m.path else "(model)")
        t.add_row(label, f"{m.calls:,}", _ms(m.self_ns), _ms(m.total_ns), _ms(m.forward_ns),
                  _ms(m.backward_ns), f"{m.kernels:,}")  # fmt: skip
    Console().print(t)
    return 0


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.3f} ms"

"""`neuron-explorer critical-path PROFILE`: the chain of events that sets a step's length."""

from __future__ import annotations

import argparse

NAME = "critical-path"
HELP = (
    "Print the critical path of one step (the median step by default): the host calls, device "
    "work and waits that set its length, split into host, device compute, DMA, collective "
    "wait and transfer, and the ops on it by share, each with what the step saves were it "
    "twice as fast (a replay)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument("--step", type=int, default=None, help="the step (default: the median)")
    parser.add_argument("--rank", type=int, default=None, help="the rank (default: the slowest)")
    parser.add_argument(
        "--annotation", default=None,
        help="a host span's name (record_function) to take as the window instead of a step",
    )  # fmt: skip
    parser.add_argument(
        "--instance", type=int, default=0, help="which instance of --annotation, from 0 (0)"
    )
    parser.add_argument("--top", type=int, default=15, help="ops listed (15)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis.critical_path import critical_path
    from ...model.profile import Profile

    page = critical_path(Profile.open(args.profile), args.step, args.annotation, args.instance,
                         args.rank)  # fmt: skip
    if args.json:
        print(json.dumps(page.to_dict(), indent=2))
        return 0
    render(page, args.top)
    return 0


def render(page, top: int = 15) -> None:  # analysis.critical_path.CriticalPath
    from rich.console import Console
    from rich.markup import escape

    from ..tables import fit_table, wrap_parts

    c = Console()
    head = [f"{escape(page.label)}, rank {page.rank}", f"step {_ms(page.step_ns)}",
            f"critical path {_ms(page.path_ns)} over {len(page.segments):,} pieces"]  # fmt: skip
    c.print(wrap_parts(c.width, head), highlight=False)
    if page.modeled:
        c.print("device times come from the cost model", highlight=False)
    split = [(k, _ms(v), _pct(v / page.step_ns if page.step_ns else 0))
             for k, v in page.by_category.items() if v]  # fmt: skip
    c.print(fit_table(c.width, ("on the path", "time", "share"), split, right=(1, 2)))
    rows = [(escape(o.label), o.category, _ms(o.dur_ns), _pct(o.share), f"{o.segments:,}",
             "-" if o.saving_if_2x_ns is None else _ms(o.saving_if_2x_ns))
            for o in page.ops[:top]]  # fmt: skip
    heads = ("op or span", "kind", "on path", "share", "pieces", "step saves at 2x")
    c.print(
        fit_table(c.width, heads, rows, title="What sets the step's length", right=(2, 3, 4, 5))
    )


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"

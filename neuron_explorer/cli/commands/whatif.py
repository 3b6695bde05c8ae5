"""`neuron-explorer whatif PROFILE --speedup ...`: a step replayed with changes applied."""

from __future__ import annotations

import argparse

NAME = "whatif"
HELP = (
    "Replay one step (the median by default) with changes applied and print the new step "
    "time: --speedup 'aten::mm=2' (an op or kernel), 'module=PATH:1.5', 'line=FILE:LINE:2'; "
    "--drop-syncs (the host no longer waits for the device); --chip trn3 (each kernel lowered "
    "again for another chip; neuron captures)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument("--speedup", action="append", default=[], metavar="WHAT=FACTOR",
                        help="make device work FACTOR times faster (repeatable)")  # fmt: skip
    parser.add_argument("--drop-syncs", action="store_true", help="remove the host's syncs")
    parser.add_argument(
        "--chip",
        default=None,
        help="re-lower every kernel for trn1, trn2, trn3 (or trn2-lnc2, trn3-lnc2)",
    )
    parser.add_argument("--step", type=int, default=None, help="the step (default: the median)")
    parser.add_argument("--annotation", default=None,
                        help="a host span's name to take as the window instead of a step")  # fmt: skip
    parser.add_argument("--instance", type=int, default=0, help="which --annotation, from 0")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis.whatif import whatif
    from ...errors import ExplorerError
    from ...model.profile import Profile

    if not (args.speedup or args.drop_syncs or args.chip):
        raise ExplorerError("whatif: name a change: --speedup, --drop-syncs or --chip")
    page = whatif(Profile.open(args.profile), args.speedup, args.drop_syncs, args.chip,
                  args.step, args.annotation, args.instance)  # fmt: skip
    if args.json:
        print(json.dumps(page.to_dict(), indent=2))
        return 0
    from rich.console import Console
    from rich.markup import escape

    c = Console()
    c.print(f"{escape(page.label)}: {'; '.join(escape(x) for x in page.changes)}", highlight=False)
    c.print(f"step {_ms(page.before_ns)} -> {_ms(page.after_ns)}  "
            f"(saves {_ms(page.saving_ns)}, {100 * page.saving_share:.1f}%)", highlight=False)  # fmt: skip
    if len(page.ranks) > 1:
        for r in page.ranks:
            c.print(f"  rank {r.rank}: {_ms(r.before_ns)} -> {_ms(r.after_ns)}", highlight=False)
    if page.modeled:
        c.print("device times come from the cost model", highlight=False)
    return 0


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms"

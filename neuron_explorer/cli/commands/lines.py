"""`neuron-explorer lines PROFILE`: device time by source line, at the level of your choice."""

from __future__ import annotations

import argparse

NAME = "lines"
HELP = (
    "Print the source lines with the most device time: your code, model code (library files "
    "such as transformers' modeling files included) or every frame."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument(
        "--level", choices=("user", "model", "all"), default="model",
        help="which frame is the line: user, model (default) or all",
    )  # fmt: skip
    parser.add_argument("--file", default=None, help="only the lines of this file")
    parser.add_argument("--top", type=int, default=20, help="rows shown (20)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    import json

    from ...analysis.hotspots import line_hotspots
    from ...model.profile import Profile

    rows = line_hotspots(Profile.open(args.profile), args.level, file=args.file).to_pylist()
    rows = rows[: args.top]
    if args.json:
        print(json.dumps({"level": args.level, "lines": rows}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Device time by line ({args.level} level; self: the innermost such frame)",
              title_justify="left")  # fmt: skip
    for h in ("file:line", "function", "self", "total", "forward", "backward"):
        text = h in ("file:line", "function")
        t.add_column(h, justify="left" if text else "right", overflow="fold", no_wrap=not text)
    for r in rows:
        t.add_row(f"{_short(r['file'])}:{r['line']}", r["func"], _ms(r["self_ns"]),
                  _ms(r["total_ns"]), _ms(r["forward_ns"]), _ms(r["backward_ns"]))  # fmt: skip
    Console().print(t)
    return 0


def _short(file: str) -> str:
    """A library file from its package on (site-packages/transformers/... -> transformers/...)."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.3f} ms"

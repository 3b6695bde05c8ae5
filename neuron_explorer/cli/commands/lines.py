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

    from ...analysis.hotspots import lines_page
    from ..scope import open_analysed

    page = lines_page(open_analysed(args.profile, args.json), args.level, args.file, args.top)
    if args.json:
        print(json.dumps(page.to_dict(), indent=2))
        return 0
    render_lines(page)
    return 0


def render_lines(page) -> None:  # analysis.hotspots.Lines
    from rich.console import Console
    from rich.markup import escape

    from ..tables import fit_table

    rows = [(escape(f"{_short(r['file'])}:{r['line']}"), escape(r["func"]), _ms(r["self_ns"]),
             _ms(r["total_ns"]), _ms(r["forward_ns"]), _ms(r["backward_ns"]))
            for r in page.lines]  # fmt: skip
    heads = ("file:line", "function", "self", "total", "forward", "backward")
    title = f"Device time by line ({page.level} level; self: the innermost such frame)"
    c = Console()
    c.print(fit_table(c.width, heads, rows, title=title, text=(0, 1), right=range(2, 6)))


def _short(file: str) -> str:
    """A library file from its package on (site-packages/transformers/... -> transformers/...)."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.3f} ms"

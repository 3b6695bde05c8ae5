"""`neuron-explorer report PROFILE`: findings, readiness, top lines and modules, and deltas
against a baseline, as Markdown for a pull request (or JSON)."""

from __future__ import annotations

import argparse

NAME = "report"
HELP = (
    "Write a profile's findings (with lines and fixes), readiness block, top lines and modules "
    "and, with --against, the before/after deltas, as Markdown to paste into a pull request."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument("--against", metavar="BASE", help="baseline profile (the run before)")
    parser.add_argument("--format", choices=("md", "json"), default="md",
                        help="md (default): Markdown; json: the same report as one JSON document")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    import json

    from ...agents.report import profile_report, render_markdown
    from ...model.profile import Profile

    profile = Profile.open(args.profile)
    base = Profile.open(args.against) if args.against else None
    doc = profile_report(profile, base)
    print(
        json.dumps(doc, indent=2, default=str) if args.format == "json" else render_markdown(doc),
        end="\n" if args.format == "json" else "",
    )
    return 0

"""`neuron-explorer export`: a profile as a Perfetto/Chrome trace or as CSV tables."""

from __future__ import annotations

import argparse

from ...exporters import EXPORTERS

NAME = "export"
HELP = "Write a profile as a Chrome/Perfetto trace (JSON) or as CSV tables."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", metavar="PROFILE", help="profile directory to export")
    parser.add_argument(
        "--format",
        choices=list(EXPORTERS),
        default="perfetto",
        help="perfetto: trace-event JSON for ui.perfetto.dev and chrome://tracing (.json or "
        ".json.gz by the output name); csv: a directory with one CSV per table "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="output path (default: beside the profile, PROFILE.perfetto.json.gz or PROFILE-csv)",
    )
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    import time

    from rich.console import Console

    from ...exporters import export
    from ...model import Profile

    profile = Profile.open(args.profile)
    err = Console(stderr=True)
    started = time.perf_counter()
    with _RichProgress(err, f"exporting {profile.name} as {args.format}") as progress:
        result = export(profile, args.format, args.output, force=args.force, progress=progress)
    seconds = time.perf_counter() - started
    counts = ", ".join(f"{n:,} {what}" for what, n in result.counts.items())
    # soft_wrap: a long path stays one piece (a terminal folds it; a pipe gets it whole)
    Console().print(f"wrote {result.path} ({counts}) in {seconds:.1f} s", highlight=False,
                    soft_wrap=True)  # fmt: skip
    return 0


class _RichProgress:
    """A rich progress bar on stderr, shown only on a terminal and cleared when done."""

    def __init__(self, console, description: str) -> None:  # rich Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self._task = self._bar.add_task(description, total=None)

    def __enter__(self) -> _RichProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def start(self, total_rows: int) -> None:
        self._bar.update(self._task, total=total_rows)

    def advance(self, rows: int) -> None:
        self._bar.advance(self._task, rows)

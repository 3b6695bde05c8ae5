"""`neuron-explorer import TRACE... -o PROFILE_DIR`: a torch.profiler trace into a profile."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...model.profile import Profile

NAME = "import"
HELP = (
    "Import torch.profiler (Kineto) traces (.json or .json.gz; several files or a directory "
    "for several ranks), or a memory snapshot pickle, into a profile directory."
)
PROGRESS_MIN_BYTES = 16 << 20  # about 0.4 s of import: below this, no bar


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces", nargs="+", type=Path, metavar="TRACE", help="trace files or directories of them"
    )
    parser.add_argument(
        "-o", "--output", required=True, type=Path, metavar="PROFILE_DIR", help="profile to write"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace PROFILE_DIR if it exists (atomically)"
    )
    parser.add_argument(
        "--source-root",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="where to look for the source files named by the trace's Python stacks "
        "(repeatable; the trace's own directory is always searched, nothing else)",
    )
    parser.add_argument(
        "--mixed-runs",
        action="store_true",
        help="merge traces even when they look like different runs (another world size, or "
        "time spans that do not overlap)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")


def run(args: argparse.Namespace) -> int:
    import sys

    from ...importers import import_traces, trace_files
    from ...model.profile import Profile

    files = trace_files(args.traces)
    size = sum(f.stat().st_size for f in files)
    gz = any(f.name.endswith(".gz") for f in files)
    # gzip'd traces are about a tenth of their JSON
    show_bar = not args.quiet and (size * (10 if gz else 1)) >= PROGRESS_MIN_BYTES
    kw = {"overwrite": args.force, "source_roots": args.source_root, "mixed_runs": args.mixed_runs}
    if len(files) == 1 and _holds_runtime(files[0]):  # the neuron plugin's: merged as captured
        from ...capture.device_import import import_device_trace

        out = import_device_trace(files[0], args.output, overwrite=args.force,
                                  source_roots=args.source_root)  # fmt: skip
    elif show_bar:
        out = _with_bar(files, args.output, kw)
    else:
        out = import_traces(files, args.output, **kw)
    profile = Profile.open(out)
    stored = _store_analysis(profile)
    if not args.quiet:
        m = profile.manifest
        counts = ", ".join(f"{v} {k}" for k, v in sorted(m.row_counts.items()))
        print(
            f"imported {len(files)} trace file(s) into {out}: {counts}; "
            f"{len(m.ranks)} rank(s), {len(m.steps)} step(s)",
            file=sys.stderr,
        )
        if stored:
            print(f"stored the first page's analysis in {out / 'analysis'}", file=sys.stderr)
    return 0


def _holds_runtime(path: Path) -> bool:
    from ...capture.device_trace import holds_runtime

    return holds_runtime(path)


def _store_analysis(profile: Profile) -> bool:
    """Leave a large profile's summary, devices, op and line tables in its folder
    (analysis/stored.py), so a server's first visit reads them instead of every event."""
    from ...analysis import stored

    if int(profile.manifest.row_counts.get("events") or 0) < stored.STORE_MIN_EVENTS:
        return False
    return bool(stored.write(profile))


def _with_bar(files: list[Path], out: Path, kw: dict) -> Path:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ...importers import import_traces

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("importing", total=1.0)

        def progress(stage: str, fraction: float) -> None:
            bar.update(task, description=stage, completed=fraction)

        return import_traces(files, out, progress=progress, **kw)

"""`neuron-explorer import TRACE... -o PROFILE_DIR`: a torch.profiler trace into a profile."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

# light: the registry imports no numpy or Arrow
from ...importers import DEFAULT_MEMORY_BUDGET, arrow_on_system_allocator

if TYPE_CHECKING:
    from ...model.profile import Profile

NAME = "import"
HELP = (
    "Import torch.profiler (Kineto) traces (.json or .json.gz; several files or a directory "
    "for several ranks), or a memory snapshot pickle, into a profile directory."
)


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
    parser.add_argument(
        "--memory-budget",
        type=memory_budget,
        default=DEFAULT_MEMORY_BUDGET,
        metavar="SIZE",
        help="memory for reading each trace (512M, 2G...; default 2G): the file is read as a "
        "stream in ranges sized to it and the events' args wait on disk; 'none' reads each "
        "file in memory, in several processes (faster, memory grows with the trace)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress or summary")


def run(args: argparse.Namespace) -> int:
    import sys

    arrow_on_system_allocator()  # before anything loads pyarrow: the import and the analysis
    from ...importers import import_traces, trace_files
    from ...model.profile import Profile

    files = trace_files(args.traces)
    kw = {
        "overwrite": args.force,
        "source_roots": args.source_root,
        "mixed_runs": args.mixed_runs,
        "memory_budget": args.memory_budget,
    }
    if len(files) == 1 and _holds_runtime(files[0]):  # the neuron plugin's: merged as captured
        from ...capture.device_import import import_device_trace

        out = import_device_trace(files[0], args.output, overwrite=args.force,
                                  source_roots=args.source_root)  # fmt: skip
    elif args.quiet:
        out = import_traces(files, args.output, **kw)
    else:
        out = _with_progress(files, args.output, kw)
    profile = Profile.open(out)
    stored = _store_analysis(profile, args.memory_budget)
    if not args.quiet:
        m = profile.manifest
        counts = ", ".join(f"{v} {k}" for k, v in sorted(m.row_counts.items()))
        print(
            f"imported {len(files)} trace file(s) into {out}: {counts}; "
            f"{len(m.ranks)} rank(s), {len(m.steps)} step(s)",
            file=sys.stderr,
        )
        if stored:
            print(stored, file=sys.stderr)
    return 0


def _holds_runtime(path: Path) -> bool:
    from ...capture.device_trace import holds_runtime

    return holds_runtime(path)


def _store_analysis(profile: Profile, budget: int | None) -> str:
    """Leave a large profile's first page (summary, findings, devices, op and line tables) in
    its folder, of the whole or of an excerpt (analysis/scoped.py), so a server's first visit
    reads them instead of every event; the line that says which."""
    from ...analysis.scoped import store_analysis

    return store_analysis(profile, budget)


def _with_progress(files: list[Path], out: Path, kw: dict) -> Path:
    import sys

    from ...importers import import_traces
    from ..import_progress import ImportProgress

    progress = ImportProgress(sys.stderr, sum(f.stat().st_size for f in files))
    ok = False
    try:
        path = import_traces(files, out, progress=progress, **kw)
        ok = True
        return path
    finally:
        progress.close(ok)


def memory_budget(text: str) -> int | None:
    """A --memory-budget: bytes, or None for 'none'."""
    from ..import_progress import parse_size

    if text.strip().lower() == "none":
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None

"""The Kineto import as one call: check the output, map each file, write the profile."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from ..model.io import ProfileWriter
from . import kineto, kineto_chunked, rank_runs
from .assemble import write_profile
from .kineto_extract import DecodeOptions
from .progress import Progress, Share
from .runs import check_one_run

READ_SHARE = 0.85  # share of the progress bar for reading and mapping the files


def import_kineto(
    paths: Sequence[Path],
    out: Path,
    *,
    progress: Progress | None = None,
    overwrite: bool = False,
    source_roots: Sequence[Path] = (),
    thread_names: bool = True,
    mixed_runs: bool = False,
    memory_budget: int | None = None,
    chunk_budget: int | None = None,
) -> Path:
    """Import Kineto trace files (one per rank) into a profile directory, atomically
    (`memory_budget`: bytes; each file read as a stream, its args kept on disk:
    kineto_columns; a file whose mapping would not fit it, or `chunk_budget`, in chunks:
    kineto_chunked)."""
    import pyarrow as pa

    # The system allocator hands freed buffers straight back to the OS; Arrow's default pool
    # keeps them for reuse, which adds the import's intermediate columns to its peak memory.
    pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        options = DecodeOptions(memory_budget=memory_budget, chunk_budget=chunk_budget)
        return _import(
            paths, out, progress, overwrite, source_roots, thread_names, mixed_runs, options
        )
    finally:
        pa.set_memory_pool(pool)


def _no_progress(
    stage: str, fraction: float, events: int | None = None, bytes_read: int | None = None
) -> None:
    pass


def _import(
    paths: Sequence[Path],
    out: Path,
    progress: Progress | None,
    overwrite: bool,
    source_roots: Sequence[Path],
    thread_names: bool,
    mixed_runs: bool,
    options: DecodeOptions,
) -> Path:
    report = progress or _no_progress
    sizes = [max(p.stat().st_size, 1) for p in paths]
    total = float(sum(sizes))
    with ProfileWriter(out, overwrite=overwrite) as writer:  # fails now if `out` exists
        if len(paths) == 1 and kineto_chunked.chunked(paths[0], options):
            return kineto_chunked.write_chunked(
                paths[0], writer, options, thread_names=thread_names, source_roots=source_roots,
                progress=lambda f, n=None: report(
                    f"reading {paths[0].name}", f, n, int(min(1.0, f / kineto_chunked.PLAN_SHARE) * total)
                ),
            )  # fmt: skip
        counted = _Events()
        before = [0, *itertools.accumulate(sizes)]

        def file_progress(k: int, path: Path) -> Share:
            """File `k`'s progress as the import's (events counted over the files)."""
            if k:
                counted.file_done()
            done, size = before[k], sizes[k]

            def share(fraction: float, events: int | None = None) -> None:
                read = done + min(1.0, fraction / kineto.DECODE_SHARE) * size
                part = READ_SHARE * (done + fraction * size) / total
                report(f"reading {path.name}", part, counted.now(events), int(read))

            return share

        def write_progress(f: float) -> None:
            report(
                "writing profile", READ_SHARE + (1 - READ_SHARE) * f, counted.now(None), int(total)
            )

        if len(paths) > 1 and options.memory_budget is not None:
            return rank_runs.write_ranks(
                paths, writer, options, file_progress=file_progress,
                write_progress=write_progress, thread_names=thread_names,
                source_roots=source_roots, mixed_runs=mixed_runs,
            )  # fmt: skip
        loaded = [
            kineto.load(path, file_progress(k, path), options, thread_names=thread_names)
            for k, path in enumerate(paths)
        ]
        if not mixed_runs:
            check_one_run(loaded)
        counted.file_done()
        return write_profile(
            loaded, out, writer=writer, source_roots=source_roots, progress=write_progress
        )


class _Events:
    """Events decoded: of the files read before, and of the one being read."""

    def __init__(self) -> None:
        self.before = self.current = 0

    def now(self, current: int | None) -> int:
        if current is not None:
            self.current = current
        return self.before + self.current

    def file_done(self) -> None:
        self.before, self.current = self.before + self.current, 0

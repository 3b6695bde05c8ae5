"""The Kineto import as one call: check the output, map each file, write the profile."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..model.io import ProfileWriter
from . import kineto, kineto_chunked
from .assemble import write_profile
from .kineto_extract import DecodeOptions
from .progress import Progress
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
        loaded, done, counted = [], 0.0, _Events()
        for path, size in zip(paths, sizes, strict=True):

            def file_progress(
                fraction: float,
                events: int | None = None,
                done: float = done,
                size: int = size,
                name: str = path.name,
            ) -> None:
                read = done + min(1.0, fraction / kineto.DECODE_SHARE) * size
                share = READ_SHARE * (done + fraction * size) / total
                report(f"reading {name}", share, counted.now(events), int(read))

            loaded.append(kineto.load(path, file_progress, options, thread_names=thread_names))
            done += size
            counted.file_done()
        if not mixed_runs:
            check_one_run(loaded)
        return write_profile(
            loaded,
            out,
            writer=writer,
            source_roots=source_roots,
            progress=lambda f: report(
                "writing profile", READ_SHARE + (1 - READ_SHARE) * f, counted.now(None), int(total)
            ),
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

"""The Kineto import as one call: check the output, map each file, write the profile."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ..model.io import ProfileWriter
from . import kineto
from .assemble import write_profile
from .kineto_extract import DecodeOptions
from .runs import check_one_run

READ_SHARE = 0.85  # share of the progress bar for reading and mapping the files


def import_kineto(
    paths: Sequence[Path],
    out: Path,
    *,
    progress: Callable[[str, float], None] | None = None,
    overwrite: bool = False,
    source_roots: Sequence[Path] = (),
    thread_names: bool = True,
    mixed_runs: bool = False,
    memory_budget: int | None = None,
) -> Path:
    """Import Kineto trace files (one per rank) into a profile directory, atomically
    (`memory_budget`: bytes; each file read as a stream, its args kept on disk:
    kineto_columns)."""
    import pyarrow as pa

    # The system allocator hands freed buffers straight back to the OS; Arrow's default pool
    # keeps them for reuse, which adds the import's intermediate columns to its peak memory.
    pool = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        options = DecodeOptions(memory_budget=memory_budget)
        return _import(
            paths, out, progress, overwrite, source_roots, thread_names, mixed_runs, options
        )
    finally:
        pa.set_memory_pool(pool)


def _import(
    paths: Sequence[Path],
    out: Path,
    progress: Callable[[str, float], None] | None,
    overwrite: bool,
    source_roots: Sequence[Path],
    thread_names: bool,
    mixed_runs: bool,
    options: DecodeOptions,
) -> Path:
    report = progress or (lambda stage, f: None)
    sizes = [max(p.stat().st_size, 1) for p in paths]
    total = float(sum(sizes))
    with ProfileWriter(out, overwrite=overwrite) as writer:  # fails now if `out` exists
        loaded, done = [], 0.0
        for path, size in zip(paths, sizes, strict=True):

            def file_progress(
                f: float, done: float = done, size: int = size, name: str = path.name
            ) -> None:
                report(f"reading {name}", READ_SHARE * (done + f * size) / total)

            loaded.append(kineto.load(path, file_progress, options, thread_names=thread_names))
            done += size
        if not mixed_runs:
            check_one_run(loaded)
        return write_profile(
            loaded,
            out,
            writer=writer,
            source_roots=source_roots,
            progress=lambda f: report("writing profile", READ_SHARE + (1 - READ_SHARE) * f),
        )

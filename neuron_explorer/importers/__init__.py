"""Importers turn trace files from other profilers into a profile directory.

One registry lists them; `import_traces` expands directories, picks the importer that
recognises the first file and runs it. Built-in: kineto (torch.profiler's Chrome JSON).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInputError, ExplorerError
from .progress import Progress

TRACE_SUFFIXES = (".json", ".json.gz")
DEFAULT_MEMORY_BUDGET = 2 << 30  # bytes: the streaming import's budget (CLI, serve, fleet)


@dataclass(frozen=True)
class Importer:
    """An importer: a name, a test on the start of a file, and the function that imports."""

    name: str
    description: str
    recognises: Callable[[Path], bool]
    run: Callable[..., Path]


def _kineto_recognises(path: Path) -> bool:
    if path.name.endswith(TRACE_SUFFIXES):
        return True
    try:
        with path.open("rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return False
    return head.startswith((b"{", b"[", b"\x1f\x8b"))


def _kineto_run(paths: Sequence[Path], out: Path, **kw: object) -> Path:
    from .run import import_kineto

    return import_kineto(paths, out, **kw)  # type: ignore[arg-type]


def _snapshot_recognises(path: Path) -> bool:
    from .memory_snapshot import recognises

    return recognises(path)


def _snapshot_run(paths: Sequence[Path], out: Path, **kw: object) -> Path:
    from .memory_snapshot import import_snapshot

    return import_snapshot(paths, out, **kw)  # type: ignore[arg-type]


IMPORTERS: dict[str, Importer] = {
    "kineto": Importer(
        "kineto",
        "torch.profiler (Kineto) Chrome trace JSON, .json or .json.gz, one file per rank",
        _kineto_recognises,
        _kineto_run,
    ),
    "memory_snapshot": Importer(
        "memory_snapshot",
        "a memory snapshot pickle (torch.cuda.memory._dump_snapshot, torch.neuron.memory's)",
        _snapshot_recognises,
        _snapshot_run,
    ),
}


def arrow_on_system_allocator() -> None:
    """Have Arrow allocate from the system allocator, which hands freed blocks back to the OS,
    where pyarrow is not loaded yet (it picks its allocator once, as it loads; a choice made in
    ARROW_DEFAULT_MEMORY_POOL is kept). Its default, mimalloc, keeps them, and the Parquet
    writer's buffers and the readers' come from it whatever pool pyarrow is given (the 100 MB
    benchmark trace's import peaked 24 MB higher on it)."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def trace_files(paths: Sequence[str | Path]) -> list[Path]:
    """The trace files named by `paths`, a directory standing for the traces directly in it."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(
                x for x in p.iterdir() if x.is_file() and x.name.endswith(TRACE_SUFFIXES)
            )
            if not found:
                raise BadInputError(p, "directory holds no .json or .json.gz trace files")
            files += found
        elif p.is_file():
            files.append(p)
        elif p.exists():
            raise BadInputError(p, "not a regular file")
        else:
            raise BadInputError(p, "no such file or directory")
    if not files:
        raise ExplorerError("no trace files given")
    return files


def import_traces(
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    progress: Progress | None = None,
    overwrite: bool = False,
    source_roots: Sequence[Path] = (),
    importer: str | None = None,
    thread_names: bool = True,
    mixed_runs: bool = False,
    memory_budget: int | None = None,
    chunk_budget: int | None = None,
) -> Path:
    """Import trace files (or directories of them) into a new profile directory at `out`
    (`thread_names`: lanes named by the traces' thread_name metadata, else by thread id;
    `mixed_runs`: merge traces that look like different runs, importers/runs.py;
    `memory_budget`: bytes, the streaming import, else each file decoded in memory;
    `chunk_budget`: bytes a chunk's mapping may take, forcing the chunked import of a single
    trace file: tests)."""
    arrow_on_system_allocator()
    files = trace_files(paths)
    if importer is None:
        chosen = next((i for i in IMPORTERS.values() if i.recognises(files[0])), None)
        if chosen is None:
            known = ", ".join(TRACE_SUFFIXES)
            raise BadInputError(files[0], f"unknown trace format (expected {known})")
    else:
        chosen = IMPORTERS[importer]
    return chosen.run(
        files,
        Path(out),
        progress=progress,
        overwrite=overwrite,
        source_roots=source_roots,
        thread_names=thread_names,
        mixed_runs=mixed_runs,
        memory_budget=memory_budget,
        **({"chunk_budget": chunk_budget} if chunk_budget is not None else {}),
    )

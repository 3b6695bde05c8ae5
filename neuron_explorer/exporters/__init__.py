"""Exporters: a profile written in another tool's format. One line per exporter in EXPORTERS;
each module has NAME, HELP, DEFAULT_SUFFIX, check_output(path), write(profile, tmp, progress)
and returns what it wrote. `export()` does the parts every format shares: the output checks and
the atomic write (temporary name, then rename)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from ..errors import BadInputError, ExplorerError

if TYPE_CHECKING:  # the CLI reads EXPORTERS for --help, which must not import pyarrow
    from collections.abc import Iterator

    import pyarrow as pa

    from ..model import Profile

BATCH_ROWS = 64 * 1024  # bounds memory: exporters hold one batch of rows at a time

# format name -> module under neuron_explorer.exporters
EXPORTERS: dict[str, str] = {
    "perfetto": "perfetto",
    "csv": "csv_tables",
}


class Progress(Protocol):
    """What an exporter reports while it runs: the rows it will read, then rows done."""

    def start(self, total_rows: int) -> None: ...
    def advance(self, rows: int) -> None: ...


class NoProgress:
    def start(self, total_rows: int) -> None:
        pass

    def advance(self, rows: int) -> None:
        pass


@dataclass(frozen=True)
class ExportResult:
    format: str
    path: Path
    counts: dict[str, int]  # what was written: trace-event phases, or rows per CSV file


def expected_rows(profile: Profile, *tables: str) -> int:
    """Rows the manifest says the tables hold (for progress bars; reads no data)."""
    return sum(int(profile.manifest.row_counts.get(t, 0)) for t in tables)


def exporter(name: str) -> ModuleType:
    if name not in EXPORTERS:
        raise ExplorerError(f"unknown export format {name!r}; choose from {', '.join(EXPORTERS)}")
    return importlib.import_module(f"{__name__}.{EXPORTERS[name]}")


def default_output(profile_path: Path, name: str) -> Path:
    """Where an export goes when no output is named: beside the profile directory."""
    profile_path = Path(profile_path)
    return profile_path.parent / f"{profile_path.name}{exporter(name).DEFAULT_SUFFIX}"


def export(
    profile: Profile,
    name: str,
    out: str | Path | None = None,
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> ExportResult:
    """Write `profile` as format `name` to `out` (default: beside the profile), atomically."""
    from ._output import atomic_output

    module = exporter(name)
    out = Path(out) if out is not None else default_output(profile.path, name)
    module.check_output(out)
    try:
        with atomic_output(out, force=force, keep_clear_of=profile.path) as tmp:
            counts = module.write(profile, tmp, progress or NoProgress())
    except OSError as e:  # reading errors are BadInputErrors by now: this is the output side
        raise ExplorerError(f"{out}: cannot write the export ({e.strerror or e})") from None
    return ExportResult(name, out, counts)


def read_batches(
    profile: Profile, table: str, columns: list[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """The table's rows in batches, file by file (rank by rank), with read errors as one-line
    BadInputErrors. ParquetFile.iter_batches reads one row group at a time, where a dataset
    scanner reads ahead without bound when the consumer is slower than the disk."""
    import re

    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from ..model.schema import ALL_TABLES

    schema = ALL_TABLES[table].arrow_schema()
    wanted = pa.schema([schema.field(c) for c in columns]) if columns else schema
    data = profile.relation(table)  # an optional table the profile lacks: no files, no rows
    files = sorted(data.files if isinstance(data, ds.FileSystemDataset) else [], key=lambda f: [
        int(t) if t.isdigit() else t for t in re.split(r"(\d+)", f)
    ])  # fmt: skip
    for path in files:
        try:
            for batch in pq.ParquetFile(path).iter_batches(BATCH_ROWS, columns=columns):
                yield batch if batch.schema.equals(wanted) else batch.cast(wanted)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:
            raise BadInputError(path, f"corrupt Parquet table ({e})") from None

"""CSV: one file per table (events.csv, stacks.csv, counters.csv, graphs.csv: empty but for its
header when the profile has no graphs) in an output directory, with a copy of manifest.json,
streamed batch by batch. Times stay integer nanoseconds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from ..model import Profile
from ..model.io import MANIFEST
from ..model.schema import ALL_TABLES
from . import Progress, expected_rows, read_batches

NAME = "csv"
HELP = "one CSV file per table (events, stacks, counters, graphs) in a directory"
DEFAULT_SUFFIX = "-csv"


def check_output(out: Path) -> None:
    """Any name will do: the output is a directory."""


def _plain(schema: pa.Schema) -> pa.Schema:
    """The schema with dictionary-encoded strings as plain strings (CSV has no dictionaries)."""
    return pa.schema(
        [
            pa.field(f.name, f.type.value_type, f.nullable) if pa.types.is_dictionary(f.type) else f
            for f in schema
        ]
    )


def write(profile: Profile, tmp: Path, progress: Progress) -> dict[str, int]:
    """Write every table to `tmp/<table>.csv`; returns the rows written per file."""
    progress.start(expected_rows(profile, *ALL_TABLES))
    tmp.mkdir()
    shutil.copyfile(profile.path / MANIFEST, tmp / MANIFEST)
    counts = {}
    for name, table in ALL_TABLES.items():
        schema = _plain(table.arrow_schema())
        rows = 0
        path = tmp / f"{name}.csv"
        with pacsv.CSVWriter(path, schema) as writer:
            for batch in read_batches(profile, name):
                writer.write_batch(batch.cast(schema))
                rows += batch.num_rows
                progress.advance(batch.num_rows)
        counts[path.name] = rows
    return counts

"""`Profile`: a profile directory opened lazily. Tables come as Arrow (or DuckDB relations);
nothing loads all events into Python objects."""

from __future__ import annotations

import os
import stat
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..errors import BadInputError
from . import bounds
from .io import MANIFEST, SOURCES, source_relpath
from .manifest import Manifest
from .schema import ADDED_IN, ALL_TABLES, FORMAT, OPTIONAL_TABLES, SCHEMA_VERSION, TABLES

if TYPE_CHECKING:
    import duckdb
    import pyarrow.dataset as ds


# A kept source is at most 1 MB (importers/sources.py); a profile from elsewhere may hold more.
MAX_SOURCE_READ_BYTES = 8 << 20


def _parquet_dataset(path: Path, schema: pa.Schema) -> ds.Dataset:
    """A table's Parquet file or folder as a lazy dataset (pyarrow.dataset loads on first use:
    writing a profile, as an import does, reads none, and it is 8 MB of libraries)."""
    import pyarrow.dataset as ds

    return ds.dataset(str(path), format="parquet", schema=schema)


def is_profile(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


class Profile:
    """A profile directory. Open with `Profile.open(path)`; raises BadInputError if it is not
    a complete profile of a schema version this code reads."""

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.manifest = manifest
        # what the footers say, read by open(): rows per table, and bytes of all columns
        # uncompressed (a reader sizes its work by them before it reads)
        self.footer_rows: dict[str, int] = {}
        self.footer_bytes = 0
        self._values_checked = False
        self._values_error: BadInputError | None = None

    @classmethod
    def open(cls, path: str | Path) -> Profile:
        path = Path(path)
        mpath = path / MANIFEST
        if not path.is_dir():
            raise BadInputError(path, "not a profile directory (no such directory)")
        if not mpath.is_file():
            raise BadInputError(path, "not a complete profile (manifest.json is missing)")
        raw = bounds.read_manifest_json(mpath)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise BadInputError(mpath, f"not a {FORMAT} manifest")
        version = raw.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise BadInputError(
                mpath,
                f"schema version {version!r} is newer than this neuron-explorer reads "
                f"({SCHEMA_VERSION}); upgrade neuron-explorer",
            )
        try:
            manifest = Manifest.from_dict(raw)
        except (TypeError, ValueError) as e:
            raise BadInputError(mpath, f"malformed manifest ({e})") from None
        profile = cls(path, manifest)
        for name in TABLES:
            if not profile._table_path(name).exists():
                raise BadInputError(path, f"table {name} is missing")
            profile._check_footers(name)
        for name in OPTIONAL_TABLES:
            if profile._table_path(name).exists():
                profile._check_footers(name)
        return profile

    def check_values(self) -> None:
        """Refuse (BadInputError) a table whose names, kinds, tracks or paths hold a value
        longer than bounds.MAX_VALUE_BYTES; checked once per opened profile, by a reader
        that is about to read them all (not by open(), which lists use)."""
        if self._values_error is None and not self._values_checked:
            try:
                for name in TABLES:
                    bounds.check_values(bounds.table_files(self._table_path(name)))
            except BadInputError as e:
                self._values_error = e
            self._values_checked = True
        if self._values_error is not None:
            raise self._values_error

    def _check_footers(self, name: str) -> None:
        """Read each Parquet footer of a table now (a few kB, sized first), so a truncated or
        foreign file, or one split into absurdly many row groups, fails here in one line rather
        than halfway through a reader (model/bounds.py)."""
        import pyarrow.parquet as pq

        p = self._table_path(name)
        wanted = (TABLES.get(name) or OPTIONAL_TABLES[name]).arrow_schema().names
        groups = rows = 0
        for file in bounds.table_files(p):
            bounds.footer_size(file)
            try:
                meta = pq.read_metadata(file)
                names = meta.schema.to_arrow_schema().names
            except (pa.ArrowException, OSError) as e:
                raise BadInputError(file, f"corrupt Parquet table ({e})") from None
            groups, rows = groups + meta.num_row_groups, rows + meta.num_rows
            bounds.check_row_groups(file if p == file else p, groups, rows)
            self.footer_bytes += sum(
                meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)
            )
            added = ADDED_IN.get(name, {})
            missing = [
                c for c in wanted
                if c not in names and added.get(c, 0) <= self.manifest.schema_version
            ]  # fmt: skip
            if missing:
                raise BadInputError(file, f"not a {name} table (no column {missing[0]})")
        self.footer_rows[name] = rows

    @property
    def name(self) -> str:
        return self.path.name

    def _table_path(self, name: str) -> Path:
        single = self.path / f"{name}.parquet"
        return single if single.exists() or name != "events" else self.path / "events"

    def dataset(self, name: str) -> ds.Dataset:
        """The table as a pyarrow dataset (lazy; supports column projection and filters)."""
        return self._datasets[name]

    @cached_property
    def _datasets(self) -> dict[str, ds.Dataset]:
        out = {}
        for name, table in TABLES.items():
            p = self._table_path(name)
            try:
                out[name] = _parquet_dataset(p, table.arrow_schema())
            except (pa.ArrowInvalid, OSError) as e:
                raise BadInputError(p, f"corrupt Parquet table ({e})") from None
        return out

    def table(self, name: str, columns: list[str] | None = None, filter: Any = None) -> pa.Table:
        """Read a table (optionally some columns, optionally filtered by a dataset expression)."""
        try:
            return self.dataset(name).to_table(columns=columns, filter=filter)
        except (pa.ArrowInvalid, OSError) as e:
            raise BadInputError(self._table_path(name), f"corrupt Parquet table ({e})") from None

    def optional_table(self, name: str, filter: Any = None) -> pa.Table | None:
        """An optional table (OPTIONAL_TABLES), optionally filtered; None when the profile has
        none."""
        p = self._table_path(name)
        if not p.exists():
            return None
        if name not in self.footer_rows:  # written since open(): read its footers first
            self._check_footers(name)
        try:
            bounds.check_values(bounds.table_files(p))
            data = _parquet_dataset(p, OPTIONAL_TABLES[name].arrow_schema())
            return data.to_table(filter=filter)
        except (pa.ArrowInvalid, OSError) as e:
            raise BadInputError(p, f"corrupt Parquet table ({e})") from None

    def relation(self, name: str) -> ds.Dataset | pa.Table:
        """Any table of ALL_TABLES as SQL and the exporters read it: a lazy dataset, or, for an
        optional table the profile lacks, an empty table of its schema."""
        if name in TABLES:
            return self.dataset(name)
        p = self._table_path(name)
        if not p.exists():
            return OPTIONAL_TABLES[name].arrow_schema().empty_table()
        if name not in self.footer_rows:
            self._check_footers(name)
        try:
            bounds.check_values(bounds.table_files(p))
            return _parquet_dataset(p, OPTIONAL_TABLES[name].arrow_schema())
        except (pa.ArrowInvalid, OSError) as e:
            raise BadInputError(p, f"corrupt Parquet table ({e})") from None

    def parquet(self, name: str) -> Path | bytes:
        """The table as one Parquet file: the path of its own file when it is one, else its
        parts (a directory of per-rank files), or an optional table's empty one, re-encoded
        into one (zstd)."""
        single = self.path / f"{name}.parquet"
        if single.is_file():
            return single
        import io

        import pyarrow.parquet as pq

        buf = io.BytesIO()
        data = self.relation(name)
        pq.write_table(data if isinstance(data, pa.Table) else data.to_table(), buf,
                       compression="zstd")  # fmt: skip
        return buf.getvalue()

    def row_count(self, name: str) -> int:
        if name in self.footer_rows:  # counted by open() in the footers: exact
            return self.footer_rows[name]
        if name in self.manifest.row_counts:
            return int(self.manifest.row_counts[name])
        try:
            return self.dataset(name).count_rows()
        except (pa.ArrowInvalid, OSError) as e:
            raise BadInputError(self._table_path(name), f"corrupt Parquet table ({e})") from None

    def duckdb(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with events, stacks, counters and graphs registered as views."""
        import duckdb

        con = duckdb.connect()
        for name in ALL_TABLES:
            con.register(name, self.relation(name))
        return con

    def source_path(self, file: str) -> Path | None:
        """Where the text of a user source file is kept, or None: only inside this profile's
        own sources/ folder (each path component resolved first, so neither a link in it nor a
        sources/ that is itself a link leads out), only a regular file of at most
        MAX_SOURCE_READ_BYTES."""
        fence = self.path.resolve() / SOURCES
        try:
            real = (fence / source_relpath(file)).resolve(strict=True)
            st = real.stat()
        except (OSError, RuntimeError, ValueError):
            return None
        if not real.is_relative_to(fence) or not stat.S_ISREG(st.st_mode):
            return None
        return real if st.st_size <= MAX_SOURCE_READ_BYTES else None

    def source_text(self, file: str) -> str | None:
        """The text of a user source file as kept in sources/ (source_path), or None."""
        real = self.source_path(file)
        if real is None:
            return None
        try:  # O_NONBLOCK: a named pipe swapped in since must not hang the reader
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (OSError, ValueError):
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SOURCE_READ_BYTES:
                return None
            try:
                return f.read(MAX_SOURCE_READ_BYTES + 1).decode("utf-8")
            except (OSError, UnicodeDecodeError):
                return None

    def __repr__(self) -> str:
        return f"Profile({str(self.path)!r}, source={self.manifest.source!r})"

"""What a profile may claim before anything reads it: a reader's work is bounded by the rows it
asks for, not by how a file nobody here wrote is laid out. Parquet footers are sized before they
are parsed, row groups and files counted against the rows they hold, and the manifest's JSON
sized, its nesting and its numbers checked, each refusal one line naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import BadInputError

# Our writer puts 65,536 rows in a row group, so a table holds one group per 65,536 rows. Every
# row group costs a reader about 200 kB and a few ms whatever it holds (measured: 3,000 one-row
# groups of events took the summary 13 s and the server from 205 to 842 MB): a table may hold
# FREE_ROW_GROUPS groups, plus one per MIN_GROUP_ROWS rows, which bounds what the layout adds.
FREE_ROW_GROUPS = 512
MIN_GROUP_ROWS = 4096
MAX_FILES = 4096  # Parquet files of one table (events/rank=N/part-0.parquet: one per rank)
# our events footers take 2.4 kB a row group (a 100M-event file: 3.6 MB); parsing one takes
# about 11 times its size
MAX_FOOTER_BYTES = 8 << 20
MAX_MANIFEST_BYTES = 32 << 20  # ~200,000 steps; ours are a few kB
MAX_JSON_DEPTH = 32  # ours nest 4 deep (device_spec)
# A string of a dictionary column is decoded once per row that names it, so one 20 MB op name
# on 40 events is 800 MB to any reader of names (the issue: 2.9 GB and 20 s for a timeline).
# Real names, paths and module paths are under a few kB; C++ template kernel names under 2 kB.
MAX_VALUE_BYTES = 16 << 10
INT64 = (-(2**63), 2**63 - 1)
_MAGIC = b"PAR1"


def table_files(path: Path) -> list[Path]:
    """The Parquet files of a table (its file, or the files under its directory), at most
    MAX_FILES."""
    if not path.is_dir():
        return [path]
    files = []
    for f in path.rglob("*.parquet"):
        files.append(f)
        if len(files) > MAX_FILES:
            raise BadInputError(path, f"more than {MAX_FILES:,} Parquet files in one table")
    return sorted(files)


def footer_size(file: Path) -> int:
    """The length of a Parquet file's footer, read from its last 8 bytes (before parsing it)."""
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 12:
                raise BadInputError(file, "corrupt Parquet table (shorter than a Parquet file)")
            f.seek(size - 8)
            tail = f.read(8)
    except OSError as e:
        raise BadInputError(file, f"cannot read ({e.strerror or e})") from None
    if tail[4:] != _MAGIC:
        raise BadInputError(file, "corrupt Parquet table (no Parquet footer)")
    length = int.from_bytes(tail[:4], "little")
    if length > size - 12:
        raise BadInputError(file, "corrupt Parquet table (footer longer than the file)")
    if length > MAX_FOOTER_BYTES:
        raise BadInputError(
            file,
            f"Parquet footer of {length / 2**20:.0f} MB, more than the "
            f"{MAX_FOOTER_BYTES >> 20} MB this reads (a table split into too many row groups?)",
        )
    return length


def check_row_groups(where: Path, groups: int, rows: int) -> None:
    """Refuse a table split into more row groups than its rows justify."""
    allowed = FREE_ROW_GROUPS + rows // MIN_GROUP_ROWS
    if groups > allowed:
        raise BadInputError(
            where,
            f"{groups:,} row groups for {rows:,} rows, more than the {allowed:,} this reads "
            f"({FREE_ROW_GROUPS} plus one per {MIN_GROUP_ROWS:,} rows); rewrite the table "
            "with larger row groups",
        )


def read_manifest_json(path: Path) -> dict[str, Any]:
    """The manifest's JSON object: at most MAX_MANIFEST_BYTES, nested at most MAX_JSON_DEPTH
    deep, without NaN or Infinity."""
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise BadInputError(
                path,
                f"manifest of {size / 2**20:.0f} MB, more than the "
                f"{MAX_MANIFEST_BYTES >> 20} MB this reads",
            )
        raw = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise BadInputError(path, f"manifest JSON nested deeper than {MAX_JSON_DEPTH}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInputError(path, f"unreadable manifest ({e.__class__.__name__})") from None
    except ValueError as e:  # NaN / Infinity
        raise BadInputError(path, f"unreadable manifest ({e})") from None
    if _depth(raw) > MAX_JSON_DEPTH:
        raise BadInputError(path, f"manifest JSON nested deeper than {MAX_JSON_DEPTH}")
    return raw


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _depth(value: Any) -> int:
    """How deep lists and objects nest in a parsed JSON value (iteratively: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            if d > MAX_JSON_DEPTH:
                return d
            stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return deepest


def int64(value: Any, what: str) -> int:
    """`value` if it is an integer inside int64 (not a bool, float or string); else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is {type(value).__name__} {_short(value)}, not an integer")
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError(f"{what} {_short(value)} does not fit in 64 bits")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def check_values(files: list[Path]) -> None:
    """Refuse a table whose dictionary-encoded strings (names, kinds, tracks, paths) hold a
    value longer than MAX_VALUE_BYTES. Reads only those columns' row groups, one at a time
    (60 ms for 400,000 events): a reader calls it before its first pass over a profile."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for file in files:
        try:
            pf = pq.ParquetFile(file)
            cols = [f.name for f in pf.schema_arrow if pa.types.is_dictionary(f.type)]
            for i in range(pf.num_row_groups) if cols else ():
                for name, col in zip(cols, pf.read_row_group(i, columns=cols).columns, strict=True):
                    for chunk in col.chunks:
                        if len(chunk.dictionary):
                            n = pc.max(pc.binary_length(chunk.dictionary)).as_py() or 0
                            if n > MAX_VALUE_BYTES:
                                raise BadInputError(
                                    file,
                                    f"a {name} of {n:,} bytes, longer than the "
                                    f"{MAX_VALUE_BYTES:,} this reads",
                                )
        except (pa.ArrowException, OSError) as e:
            raise BadInputError(file, f"corrupt Parquet table ({e})") from None


def machine_bytes() -> int:
    """The memory this process may use: the machine's, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total

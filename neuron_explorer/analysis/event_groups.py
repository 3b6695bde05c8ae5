"""The events table's row groups, from its footers read once per opened profile, read one at a
time with those footers: a timeline window's edges and small windows read a group or two, a few
milliseconds each, where a dataset scan with a filter first weighs every group's statistics
(about 20 ms a read on a 10 GB trace's profile of 583 groups), and a pass over every group
(timeline_stream.batches) reads each with less CPU than a scan of it (5.4 against 8.4 ms)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ..model.profile import Profile

GROUP_READS = 8  # a span held in more row groups than this is left to a dataset scan

_GROUPS: weakref.WeakKeyDictionary[Profile, list[tuple[float, float, int, str, int]]] = (
    weakref.WeakKeyDictionary()
)
_FOOTERS: weakref.WeakKeyDictionary[Profile, dict[str, Any]] = weakref.WeakKeyDictionary()


def row_groups(profile: Profile) -> list[tuple[float, float, int, str, int]]:
    """(least start_ns, greatest start_ns, rows, file, row group) of every events row group
    (-inf, inf without statistics), from the footers, read once per opened profile: a 10 GB
    trace's profile has about a thousand, which every window and find would parse again."""
    import pyarrow.parquet as pq

    if profile not in _GROUPS:
        out, footers = [], {}
        for path in profile.dataset("events").files:
            meta = footers[path] = pq.read_metadata(path)
            col = meta.schema.to_arrow_schema().get_field_index("start_ns")
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                st = rg.column(col).statistics
                known = st is not None and st.has_min_max
                lo, hi = (float(st.min), float(st.max)) if known else (-np.inf, np.inf)
                out.append((lo, hi, rg.num_rows, path, g))
        _FOOTERS[profile] = footers
        _GROUPS[profile] = out
    return _GROUPS[profile]


def group_tables_at(profile: Profile, columns: list[str], lo: float = -np.inf,
                    hi: float = np.inf) -> Iterator[tuple[pa.Table, int]]:  # fmt: skip
    """group_tables with each group's first row's position among all the events' rows in
    stored order (what a streamed index's per-row lanes and depths are indexed by)."""
    import pyarrow.parquet as pq

    schema = profile.dataset("events").schema
    want = pa.schema([schema.field(c) for c in columns])
    first = 0
    for least, most, n, path, g in row_groups(profile):
        if least < hi and most >= lo:
            f = pq.ParquetFile(path, metadata=_FOOTERS[profile][path])
            yield f.read_row_group(g, columns=columns).cast(want), first
        first += n


def readable(profile: Profile, columns: list[str]) -> bool:
    """Whether every events file holds `columns` itself (a column a file lacks, as a rank of a
    folder of ranks, is filled by a dataset scan only)."""
    row_groups(profile)  # reads the footers once
    return all(set(columns) <= set(meta.schema.to_arrow_schema().names)
               for meta in _FOOTERS[profile].values())  # fmt: skip


def group_tables(profile: Profile, columns: list[str], lo: float = -np.inf,
                 hi: float = np.inf) -> Iterator[pa.Table]:  # fmt: skip
    """Each row group that may hold events starting in [lo, hi), in stored order, as a table of
    `columns` typed as the dataset types them (every row of the group: the caller filters);
    only for `readable` columns."""
    import pyarrow.parquet as pq

    schema = profile.dataset("events").schema
    want = pa.schema([schema.field(c) for c in columns])
    for least, most, _, path, g in row_groups(profile):
        if least < hi and most >= lo:
            # a file object per read: the server reads from several threads at once
            f = pq.ParquetFile(path, metadata=_FOOTERS[profile][path])
            yield f.read_row_group(g, columns=columns).cast(want)


def read_starting(profile: Profile, columns: list[str], lo: int, hi: int,
                  max_groups: int = GROUP_READS) -> pa.Table | None:  # fmt: skip
    """The `columns` (typed as the dataset types them) of the row groups that may hold events
    starting in [lo, hi), in stored order, with every row of those groups (the caller filters);
    None when more than `max_groups` groups hold them or a file lacks a column (then a dataset
    scan, which fills it, reads them)."""
    groups = sum(1 for least, most, *_ in row_groups(profile) if least < hi and most >= lo)
    if groups > max_groups or not readable(profile, columns):
        return None
    parts = list(group_tables(profile, columns, lo, hi))
    if not parts:
        schema = profile.dataset("events").schema
        return pa.schema([schema.field(c) for c in columns]).empty_table()
    return pa.concat_tables(parts)

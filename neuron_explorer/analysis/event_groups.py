"""The events table's row groups, from its footers read once per opened profile, and a read of
the events starting in a short span by row group: a timeline window's edges and small windows
read a group or two, a few milliseconds each, where a dataset scan with a filter first weighs
every group's statistics (about 20 ms a read on a 10 GB trace's profile of 583 groups)."""

from __future__ import annotations

import weakref

import numpy as np
import pyarrow as pa

from ..model.profile import Profile

GROUP_READS = 8  # a span held in more row groups than this is left to a dataset scan

_GROUPS: weakref.WeakKeyDictionary[Profile, list[tuple[float, float, int, str, int]]] = (
    weakref.WeakKeyDictionary()
)
_FOOTERS: weakref.WeakKeyDictionary[Profile, dict[str, object]] = weakref.WeakKeyDictionary()


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


def read_starting(profile: Profile, columns: list[str], lo: int, hi: int,
                  max_groups: int = GROUP_READS) -> pa.Table | None:  # fmt: skip
    """The `columns` (typed as the dataset types them) of the row groups that may hold events
    starting in [lo, hi), in stored order, with every row of those groups (the caller filters);
    None when more than `max_groups` groups hold them or a file lacks a column (then a dataset
    scan, which fills it, reads them)."""
    import pyarrow.parquet as pq

    groups = [(path, g) for least, most, _, path, g in row_groups(profile)
              if least < hi and most >= lo]  # fmt: skip
    if len(groups) > max_groups:
        return None
    schema = profile.dataset("events").schema
    want = pa.schema([schema.field(c) for c in columns])
    parts = []
    for path, g in groups:
        # a file object per read: the server reads from several threads at once
        f = pq.ParquetFile(path, metadata=_FOOTERS[profile][path])
        if any(f.schema_arrow.get_field_index(c) < 0 for c in columns):
            return None
        parts.append(f.read_row_group(g, columns=columns).cast(want))
    return pa.concat_tables(parts) if parts else want.empty_table()

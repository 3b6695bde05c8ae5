"""Find on a profile too big to hold in memory: the same SearchResult as analysis.search, in
memory bounded by one row group.

Pattern: names repeat, so a profile's distinct names with their counts (`name_counts`, a pass
over the name column computed once and kept) answer `total` and `names` without a scan.
Algorithm: the first matches in time order come from the row groups taken in the order of
their least start (Parquet statistics), only the name column read until one holds a match, and
the reading stops once the next row group starts after the last of the first matches kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from .event_groups import row_groups
from .search import (
    MATCH_COLUMNS,
    MAX_MATCHES,
    SearchResult,
    _checked,
    _duckdb_errors,
    _name_codes,
    _predicate,
    _result,
)

COUNT_SCHEMA = pa.schema([("name", pa.string()), ("events", pa.int64())])


def name_counts(profile: Profile) -> pa.Table:
    """Each distinct name of the events (nulls left out) with how many events carry it, read a
    row group at a time."""
    import pyarrow.parquet as pq

    counter = NameCounter()
    for path in profile.dataset("events").files:
        f = pq.ParquetFile(path)
        for g in range(f.num_row_groups):
            counter.add(f.read_row_group(g, columns=["name"]).column("name"))
    return counter.table()


class NameCounter:
    """name_counts over name columns passed in turn: what a pass that reads the names anyway
    (the streamed timeline index's) counts, so find's first answer needs no pass of its own."""

    def __init__(self) -> None:
        self.parts: list[pa.Table] = []

    def add(self, names: pa.ChunkedArray) -> None:
        codes, values = _name_codes(names)
        n = np.bincount(codes[codes >= 0], minlength=len(values))
        used = np.flatnonzero(n)
        kept = values.take(pa.array(used)).cast(pa.string())
        self.parts.append(pa.table({"name": kept, "events": pa.array(n[used], pa.int64())}))
        if len(self.parts) > 64:
            self.parts = [_summed(self.parts)]

    def table(self) -> pa.Table:
        return _summed(self.parts) if self.parts else COUNT_SCHEMA.empty_table()


def _summed(parts: list[pa.Table]) -> pa.Table:
    t = pa.concat_tables(parts).group_by("name").aggregate([("events", "sum")])
    return t.rename_columns(["name", "events"]).sort_by("name").cast(COUNT_SCHEMA)


def search_bounded(
    profile: Profile, counts: pa.Table, q: str, regex: bool = False, limit: int = MAX_MATCHES,
    con: Any = None,
) -> SearchResult:  # fmt: skip
    """analysis.search.search of `profile` given its `name_counts`, a row group at a time."""
    import duckdb
    import pyarrow.parquet as pq

    q, limit = _checked(q, limit)
    con = con if con is not None else duckdb.connect()

    def matched() -> list[tuple[str, int]]:
        con.register("_search_counts", counts)
        try:
            return con.execute(
                f"SELECT name AS n, events FROM _search_counts WHERE {_predicate(regex)}", [q]
            ).fetchall()  # fmt: skip
        finally:
            con.unregister("_search_counts")

    found = _duckdb_errors(matched)
    total = sum(int(k) for _, k in found)
    names = [n for n, _ in found]
    if not total:
        return _result(q, regex, 0, (), ())
    wanted = pa.array(names, pa.string())
    kept: list[dict[str, Any]] = []
    seen = 0
    files: dict[str, Any] = {}
    for least, _, _, path, g in sorted(row_groups(profile), key=lambda r: r[0]):
        if seen >= total or (len(kept) >= limit and least > kept[limit - 1]["start_ns"]):
            break  # every match found, or nothing later can come first
        f = files.setdefault(path, pq.ParquetFile(path))
        codes, values = _name_codes(f.read_row_group(g, columns=["name"]).column("name"))
        hit = np.append(pc.is_in(values.cast(pa.string()), wanted).to_numpy(zero_copy_only=False),
                        False)  # fmt: skip
        rows = np.flatnonzero(hit[codes])
        if not len(rows):
            continue
        seen += len(rows)
        part = f.read_row_group(g, columns=MATCH_COLUMNS).take(pa.array(rows))
        kept = sorted(kept + part.to_pylist(), key=lambda r: (r["start_ns"], r["id"]))[:limit]
    return _result(q, regex, total, kept, names)

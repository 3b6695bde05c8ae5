"""Find events by name: a case-insensitive substring, or a regular expression (RE2, so a
hostile pattern still runs in linear time). The timeline steps through the matches and
highlights the names matched.

Algorithm: names are matched once per distinct name (the column is dictionary-encoded and
names repeat), in DuckDB; the events carrying a matched name are found by their dictionary
code in numpy, with the analysis context's decoded codes when it has them (no read at all).
`search_sql` is the same answer in plain SQL, kept as the reference the tests compare with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ExplorerError
from ..model.profile import Profile
from .page import PageModel, fetch_rows

MAX_QUERY_CHARS = 500
MAX_MATCHES = 1000  # events sent back, in time order; `total` counts them all
MAX_NAMES = 2000  # distinct matched names sent back, for highlighting
MATCH_COLUMNS = ["id", "rank", "layer", "kind", "name", "track", "device", "start_ns", "dur_ns"]


class SearchError(ExplorerError):
    """The pattern was empty, too long, or not a valid regular expression."""


@dataclass(frozen=True)
class SearchResult(PageModel):
    """Events whose name matches `query`: the first matches in time order (then id), how many
    match in all, and the distinct names matched."""

    query: str
    regex: bool
    total: int
    matches: tuple[dict[str, Any], ...]
    names: tuple[str, ...]
    truncated: bool


def _predicate(regex: bool) -> str:
    return "regexp_matches(n, ?)" if regex else "contains(lower(n), lower(?))"


def _checked(q: str, limit: int) -> tuple[str, int]:
    q = q.strip()
    if not q:
        raise SearchError("search: empty")
    if len(q) > MAX_QUERY_CHARS:
        raise SearchError(f"search: longer than the limit of {MAX_QUERY_CHARS} characters")
    return q, max(1, min(int(limit), MAX_MATCHES))


def _duckdb_errors(fn):
    """Run fn(); a DuckDB error (a bad regular expression) becomes one SearchError line."""
    import duckdb

    try:
        return fn()
    except duckdb.Error as e:
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
        raise SearchError(f"search: {first}") from None


def _result(q: str, regex: bool, total: int, matches, names) -> SearchResult:
    return SearchResult(q, regex, total, tuple(matches), tuple(sorted(names)[:MAX_NAMES]),
                        total > len(matches))  # fmt: skip


def search_sql(con: Any, q: str, regex: bool = False, limit: int = MAX_MATCHES) -> SearchResult:
    """`search` in plain SQL over the connection's `events` (the reference)."""
    q, limit = _checked(q, limit)
    names_sql = (f"SELECT n FROM (SELECT DISTINCT CAST(name AS VARCHAR) AS n FROM events) "
                 f"WHERE n IS NOT NULL AND {_predicate(regex)}")  # fmt: skip

    def run() -> SearchResult:
        names = [r[0] for r in con.execute(names_sql, [q]).fetchall()]
        if not names:
            return _result(q, regex, 0, (), ())
        found = f"WITH m AS ({names_sql}) "
        joined = "FROM events e JOIN m ON CAST(e.name AS VARCHAR) = m.n"
        total = con.execute(f"{found} SELECT count(*) {joined}", [q]).fetchall()[0][0]
        rows = fetch_rows(
            con,
            f"{found} SELECT e.id, e.rank, CAST(e.layer AS VARCHAR) AS layer, "
            "CAST(e.kind AS VARCHAR) AS kind, m.n AS name, CAST(e.track AS VARCHAR) AS track, "
            f"CAST(e.device AS VARCHAR) AS device, e.start_ns, e.dur_ns {joined} "
            "ORDER BY e.start_ns, e.id LIMIT ?",
            [q, limit],
        )
        return _result(q, regex, total, rows, names)

    return _duckdb_errors(run)


def search(
    profile: Profile, q: str, regex: bool = False, limit: int = MAX_MATCHES, con: Any = None
) -> SearchResult:
    """The events of `profile` whose name matches `q` (`con`: a DuckDB connection to match
    the names on, else one of its own)."""
    import duckdb

    q, limit = _checked(q, limit)
    con = con if con is not None else duckdb.connect()

    def matched(values: pa.Array) -> list[str]:
        con.register("_search_names", pa.table({"n": values}))
        try:
            return [r[0] for r in con.execute(
                f"SELECT n FROM _search_names WHERE n IS NOT NULL AND {_predicate(regex)}", [q]
            ).fetchall()]  # fmt: skip
        finally:
            con.unregister("_search_names")

    def hits_of(values: pa.Array) -> np.ndarray:
        """Per code into `values`, whether its name matches; the last slot (code -1) no."""
        hit = np.zeros(len(values) + 1, dtype=bool)
        found = pa.array(_duckdb_errors(lambda: matched(values)), values.type)
        hit[pc.index_in(found, values).fill_null(len(values)).to_numpy(zero_copy_only=False)] = True
        return hit

    cols = _decoded(profile)
    if cols is None:
        total, names, matches = _by_files(profile, hits_of, limit)
        return _result(q, regex, total, matches, names)
    index, distinct = cols.codes("name")
    values = pa.array(distinct, pa.string())
    rows = np.flatnonzero(hits_of(values)[index])
    start, ids = cols.ints("start_ns")[rows], cols.ints("id")[rows]
    used = [values[int(c)].as_py() for c in np.unique(index[rows])]  # used names only
    first = ids[np.lexsort((ids, start))[:limit]]  # time order, then id, as search_sql
    return _result(q, regex, len(rows), _events(profile, first), used)


def _decoded(profile: Profile) -> Any:
    """The analysis context's numpy views of the events (analysis/columns.py) when it has
    decoded them already (the summary page does), else None: a find then costs no read."""
    from .context import context

    ctx = context(profile)
    return ctx.cols if "events" in vars(ctx) else None  # a cached_property once computed


def _name_codes(col: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Per row, a code into the returned distinct names (-1: no name)."""
    col = (
        col.unify_dictionaries() if pa.types.is_dictionary(col.type) else pc.dictionary_encode(col)
    )
    chunks = col.chunks or [pa.array([], pa.dictionary(pa.int32(), pa.string()))]
    index = np.concatenate([c.indices.fill_null(-1).to_numpy(zero_copy_only=False) for c in chunks])
    return index, chunks[0].dictionary


def _by_files(profile: Profile, hits_of, limit: int) -> tuple[int, set[str], list[dict]]:
    """(total, names matched, first `limit` matches) without the decoded columns, file by file.
    Each events file is in (rank, start_ns, id) order (docs/format.md), so a rank's first
    `limit` matches in the file are its first in time: the rank and name columns are read
    whole (to count and name every match), the match columns only from the row groups that
    hold those first matches (0.4 -> 0.1 s CPU on 3.9M events: start_ns and id are not read)."""
    import pyarrow.parquet as pq

    total, names, found = 0, set[str](), list[dict[str, Any]]()
    for fragment in profile.dataset("events").get_fragments():
        f = pq.ParquetFile(fragment.path)
        t = f.read(columns=["rank", "name"])
        index, values = _name_codes(t.column("name"))
        rows = np.flatnonzero(hits_of(values)[index])
        total += len(rows)
        names.update(values[int(c)].as_py() for c in np.unique(index[rows]))
        if not len(rows):
            continue
        rank = t.column("rank").to_numpy()[rows]
        first = np.concatenate([rows[rank == r][:limit] for r in np.unique(rank)])
        sizes = np.array([f.metadata.row_group(g).num_rows for g in range(f.num_row_groups)])
        ends = np.cumsum(sizes)
        group = np.searchsorted(ends, first, side="right")  # the row group of each
        groups = np.unique(group)
        part = f.read_row_groups(groups.tolist(), columns=MATCH_COLUMNS)
        before = np.concatenate([[0], np.cumsum(sizes[groups])[:-1]])  # rows read before each
        at = np.searchsorted(groups, group)
        found += part.take(pa.array(first - (ends - sizes)[group] + before[at])).to_pylist()
    return total, names, sorted(found, key=lambda r: (r["start_ns"], r["id"]))[:limit]


def _events(profile: Profile, ids: np.ndarray) -> list[dict[str, Any]]:
    """The events with these ids, in time order (then id)."""
    if not len(ids):
        return []
    # ids follow time: row-group statistics on id skip the rest of the file
    near = (pc.field("id") >= int(ids.min())) & (pc.field("id") <= int(ids.max()))
    found = profile.table(
        "events", columns=MATCH_COLUMNS, filter=near & pc.field("id").isin(pa.array(ids))
    )
    return sorted(found.to_pylist(), key=lambda r: (r["start_ns"], r["id"]))

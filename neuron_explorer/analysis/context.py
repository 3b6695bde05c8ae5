"""The analysis context of one profile: its events (Arrow, numpy views) and the shared facts
that several rules and the summary read, each computed once into a named table (facts.py).

Rules only read it: its queries accept SELECT statements only, a query that names a shared
table builds that table first (once per profile), and a rule's own intermediate tables go into
one query as `tables=` and are gone after it. Results are cached per `Profile` object, so
running every rule scans the events a few times, not once per rule.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ExplorerError
from ..model.profile import Profile
from ..model.schema import ALL_TABLES, EVENTS
from ..vocab.kinds import GPU_WORK_KINDS  # what makes a GPU profile
from . import facts, intervals
from .columns import Columns
from .conventions import (
    ARGS_KINDS,
    DATALOADER_LIKE,
    DEVICE_WORK_KINDS,
    DOWNCAST_EVENT,
    FUSED_OPTIMIZER_LIKE,
    OPTIMIZER_STEP_LIKE,
    sql_list,
)
from .sparse import sparse_columns

if TYPE_CHECKING:
    import duckdb

    from ..vocab.device_spec import SpecFigures

HEAVY_COLUMNS = ("args", "shapes", "dtypes")  # long text; only some rules read them
UNUSED_COLUMNS = ("stack_id",)  # nothing reads it; not decoded
# the heavy columns of a table this long are read for the rows that need them only (sparse.py)
SPARSE_MIN_ROWS = 100_000
SUBSET_SHARE = 0.15  # events_of copies rows out of `ev` only when they are at most this share
# boolean columns `ev` adds, from name patterns (conventions.py)
NAME_FLAGS = {
    "is_loader": DATALOADER_LIKE,
    "is_optimizer": (OPTIMIZER_STEP_LIKE,),
    "is_fused": FUSED_OPTIMIZER_LIKE,
}
_CACHE: weakref.WeakKeyDictionary[Profile, AnalysisContext] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def context(profile: Profile) -> AnalysisContext:
    """The cached analysis context of a profile (one per open Profile object). Hold
    `ctx.lock` while using it: its DuckDB connection and temp tables are not thread-safe."""
    with _CACHE_LOCK:
        ctx = _CACHE.get(profile)
        if ctx is None:
            ctx = _CACHE[profile] = AnalysisContext(profile)
        return ctx


def merged_intervals_sql(source: str, part: str) -> str:
    """SQL merging the intervals (columns s, e) of `source` into disjoint ones per `part`
    columns (gaps and islands: a new island starts where s passes every earlier end)."""
    return f"""
    WITH src AS ({source}),
    m AS (SELECT *, max(e) OVER (PARTITION BY {part} ORDER BY s, e
                                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_e
          FROM src),
    g AS (SELECT *, sum(CASE WHEN prev_e IS NULL OR s > prev_e THEN 1 ELSE 0 END)
                    OVER (PARTITION BY {part} ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp
          FROM m)
    SELECT {part}, min(s) AS s, max(e) AS e FROM g GROUP BY {part}, grp
    """


def _valid_json_or_null(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """args with malformed JSON become NULL, so one bad row cannot stop every JSON query."""
    import duckdb

    if col.null_count == len(col):
        return col
    con = duckdb.connect()
    con.register("a", pa.table({"args": col}))
    valid = con.sql("SELECT coalesce(json_valid(args), false) AS ok FROM a").to_arrow_table()
    con.close()
    return pc.if_else(valid["ok"], col, pa.scalar(None, pa.string()))


def plain_types(table: pa.Table) -> pa.Table:
    """DuckDB sums integers into HUGEINT (Arrow decimal128); make those int64 (float64 when
    fractional) so tables stay plain numbers in Python and JSON."""
    for i, f in enumerate(table.schema):
        if pa.types.is_decimal(f.type):
            to = pa.int64() if f.type.scale == 0 else pa.float64()
            table = table.set_column(i, f.name, table.column(i).cast(to))
    return table


class AnalysisContext:
    """The events of one profile and its shared facts, built lazily, each once:

    - `ev`: the events table (Arrow, scanned in place);
    - the named tables of facts.TABLES, e.g. `steps_w(rank, step, s, e)` (step windows; one
      window per rank over all its events when the profile has no ProfilerStep spans, step
      NULL then) and `busy(rank, s, e)` (disjoint intervals where the rank's device works).

    A query that names one of those tables builds it first. Queries are SELECT only.
    """

    def __init__(self, profile: Profile) -> None:
        # weakly: _CACHE holds its contexts strongly, and a context holding its profile would
        # keep both alive for ever (a server that lets a profile go could never free its events)
        self._profile = weakref.ref(profile)
        self.manifest = profile.manifest
        self.lock = threading.RLock()  # one rule or summary at a time (the web serves threads)
        self._subsets: set[str] = set()
        self._built: dict[str, Any] = {}  # fact table name -> what its builder returned

    @property
    def profile(self) -> Profile:
        profile = self._profile()
        if profile is None:
            raise ReferenceError("the profile of this analysis context was let go")
        return profile

    @cached_property
    def events(self) -> pa.Table:
        """The event columns the rules read, decoded once by pyarrow (strings stay
        dictionary-encoded). args, shapes and dtypes are kept only on the rows whose rules
        read them (ARGS_KINDS and downcast events)."""
        skip = (*HEAVY_COLUMNS, *UNUSED_COLUMNS)
        light = self.profile.table(
            "events", columns=[c.name for c in EVENTS.columns if c.name not in skip]
        )
        self._cols = Columns(light)
        keep = self._cols.where("kind", ARGS_KINDS) | self._cols.where("name", (DOWNCAST_EVENT,))
        wanted = bool(keep.any())  # a CUDA trace has none: its long args are never decoded
        sparse = self._sparse_heavy(keep) if wanted else None
        read = wanted and sparse is None
        heavy = self.profile.table("events", columns=list(HEAVY_COLUMNS)) if read else None
        keep_arr = pa.array(keep)
        for name in HEAVY_COLUMNS:
            if sparse is not None:
                col = sparse[name]
                if name == "args":
                    col = _valid_json_or_null(col)
            elif heavy is not None and heavy[name].null_count < heavy.num_rows:
                col = pc.if_else(
                    keep_arr, heavy[name].combine_chunks(), pa.scalar(None, pa.string())
                )
                if name == "args":
                    col = _valid_json_or_null(col)
            else:
                col = pa.nulls(light.num_rows, pa.string())
            light = light.append_column(name, col)
        # name tests computed once per distinct name (on the dictionary), not per row
        for flag, patterns in NAME_FLAGS.items():
            light = light.append_column(flag, pa.array(self._cols.like("name", patterns)))
        return light

    def _sparse_heavy(self, keep: np.ndarray) -> dict[str, pa.Array] | None:
        """The heavy columns of the `keep` rows only, when they are few (sparse.py)."""
        if len(keep) < SPARSE_MIN_ROWS or keep.sum() > SUBSET_SHARE * len(keep):
            return None  # a small table, or most rows: one whole read is as cheap
        where = f"kind IN {sql_list(ARGS_KINDS)} OR name = ?"
        return sparse_columns(self.profile, HEAVY_COLUMNS, keep, where, [DOWNCAST_EVENT])

    @cached_property
    def cols(self) -> Columns:
        """numpy views of `events` (columns.py) for the array-wise parts of the analysis."""
        self.events  # noqa: B018 - builds them
        return self._cols

    @cached_property
    def _con(self) -> duckdb.DuckDBPyConnection:
        con = self.profile.duckdb()
        # every rule queries `ev`, the Arrow table above (scanned in place, not copied)
        con.register("ev", self.events)
        return con

    # -- reading (what rules use) -------------------------------------------------------------

    def rows(
        self, sql: str, params: list[Any] | None = None, *, tables: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """Run a SELECT and return the rows as dicts (for small, aggregated results only).
        `tables`: Arrow tables this one query reads by name (a rule's own intermediates)."""
        with self._local(sql, tables):
            cur = self._con.execute(sql, params or [])
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def one(
        self, sql: str, params: list[Any] | None = None, *, tables: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        rows = self.rows(sql, params, tables=tables)
        return rows[0] if rows else {}

    def arrow(
        self, sql: str, params: list[Any] | None = None, *, tables: dict[str, Any] | None = None
    ) -> pa.Table:
        with self._local(sql, tables):
            return plain_types(self._con.sql(sql, params=params or None).to_arrow_table())

    @contextmanager
    def _local(self, sql: str, tables: dict[str, Any] | None) -> Iterator[None]:
        """Check that `sql` only reads, build the shared tables it names, and register the
        query's own `tables` for its duration."""
        import duckdb

        for statement in self._con.extract_statements(sql):
            if statement.type != duckdb.StatementType.SELECT:
                raise ExplorerError(f"analysis queries only read: {statement.type.name} refused")
        self._prepare(sql)
        local = dict(tables or {})
        clash = sorted(set(local) & self.shared_names())
        if clash:
            raise ExplorerError(f"a query's own table shadows a shared one: {', '.join(clash)}")
        for name, table in local.items():
            self._con.register(name, table)
        try:
            yield
        finally:
            for name in local:
                self._con.unregister(name)

    # -- the shared facts (built here, never by a rule) -----------------------------------------

    def _prepare(self, sql: str) -> None:
        """Build every shared table that `sql` names and that is not built yet."""
        for name in set(_FACT_NAME.findall(sql)):
            self.fact(name)

    def fact(self, name: str) -> Any:
        """Build the shared table `name` once (facts.TABLES); returns what its builder did."""
        if name not in self._built:
            builder = facts.TABLES[name]
            together = [n for n, b in facts.TABLES.items() if b is builder]
            for n in together:  # a builder's own SQL names its tables: no recursion
                self._built[n] = None
            value = builder(self)
            for n in together:
                self._built[n] = value
        return self._built[name]

    def _execute(self, sql: str) -> None:
        """Run a builder's statement (DDL) to completion; DuckDB wants every result drained."""
        self._prepare(sql)
        self._con.execute(sql).fetchall()

    def _register(self, name: str, table: pa.Table) -> pa.Table:
        self._con.register(name, table)
        return table

    def shared_names(self) -> set[str]:
        """The names of every table the context itself registers (the profile's tables,
        events, subsets, facts)."""
        return {*ALL_TABLES, "ev", *self._subsets, *facts.TABLES, *facts.INTERNAL}

    @property
    def spec(self) -> SpecFigures:
        """The device spec's figures (each None without a spec)."""
        return self.manifest.spec

    @cached_property
    def is_neuron(self) -> bool:
        """A neuron profile: our own capture, or one with the device spec or neuron devices."""
        if self.manifest.source == "capture" or self.manifest.device_spec:
            return True
        return bool(self.cols.like("device", ("neuron%",)).any())

    @cached_property
    def has_gpu(self) -> bool:
        """A GPU trace: it has GPU kernels, copies or memsets."""
        return bool(self.device_rows(GPU_WORK_KINDS).any())

    @cached_property
    def has_steps(self) -> bool:
        return bool(self.fact("steps_w"))

    def steps(self) -> pa.Table:
        """Step windows: rank, step, start_ns, dur_ns (ordered)."""
        return self.arrow(
            "SELECT rank, step, s AS start_ns, e - s AS dur_ns FROM steps_w ORDER BY rank, s"
        )

    def steady_steps(self) -> pa.Table:
        """The step windows of steady-state figures (facts.steady_w: a job's first step of each
        rank left out), as `steps()`."""
        return self.arrow(
            "SELECT rank, step, s AS start_ns, e - s AS dur_ns FROM steady_w ORDER BY rank, s"
        )

    @property
    def startup_skew_ns(self) -> int:
        """How far apart a job's ranks started recording (0 for one process)."""
        return int(self.fact("steady_w") or 0)

    @cached_property
    def total_step_ns(self) -> int:
        """Sum of step durations over all ranks: the denominator of every saving share."""
        return int(self.one("SELECT coalesce(sum(e - s), 0) AS ns FROM steps_w")["ns"])

    @cached_property
    def device_ranks(self) -> frozenset[int]:
        """Ranks that have any device work."""
        rows = self.device_rows(DEVICE_WORK_KINDS)
        return frozenset(int(r) for r in np.unique(self.cols.ints("rank")[rows]))

    def device_rows(self, kinds: tuple[str, ...]) -> np.ndarray:
        """Where the events are device work of one of `kinds` (a boolean row mask)."""
        return self.cols.where("layer", ("device",)) & self.cols.where("kind", kinds)

    def subset(self, name: str, rows: np.ndarray) -> str:
        """Register the `ev` rows that the mask `rows` selects as table `name` (returned), so
        a query about a few kinds of events scans those rather than every event. The same
        name always means the same rows (the callers name them by what they hold)."""
        self._con.register(name, self.events.filter(pa.array(rows)))
        self._subsets.add(name)
        return name

    def events_of(self, kinds: tuple[str, ...], layer: str | None = None) -> str:
        """The name of a registered table of the `ev` rows of these kinds (and layer): rules
        about a few kinds of events query it instead of scanning every event."""
        name = "ev_" + "_".join((layer or "any", *kinds))
        if name not in self._subsets:
            rows = self.cols.where("kind", kinds)
            if layer is not None:
                rows = rows & self.cols.where("layer", (layer,))
            if rows.sum() > SUBSET_SHARE * self.cols.n:  # copying most rows costs more
                return "ev"
            self.subset(name, rows)
        return name

    def merge_rows(self, rows: np.ndarray) -> pa.Table:
        """The spans of the `rows` of `ev` merged into disjoint intervals per rank (rank, s,
        e), as an Arrow table (not registered)."""
        cols = self.cols
        at = np.flatnonzero(rows)
        rank = cols.ints("rank")[at]
        try:
            first, s, e = intervals.merge_arrays(rank, cols.ints("start_ns")[at], cols.end()[at])
        except OverflowError:  # spans too wide for the int64 shift: let DuckDB do it
            src = self.events.filter(pa.array(rows))
            return self.merge(
                "SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM src", src=src
            )
        return pa.table({"rank": self.events["rank"].take(pa.array(at[first])), "s": s, "e": e})

    def merge(self, source: str, part: str = "rank", **tables: pa.Table) -> pa.Table:
        """The intervals (columns s, e) that the SELECT `source` gives, merged into disjoint
        ones per `part` lane (not registered); `tables` as for `rows`."""
        cols = [c.strip() for c in part.split(",")]
        try:
            return intervals.merge(self.arrow(source, tables=tables), cols)
        except OverflowError:  # spans too wide for the int64 shift: let DuckDB do it
            return self.arrow(merged_intervals_sql(source, part), tables=tables)

    def ensure_busy(self) -> None:
        self.fact("busy")

    def ensure_recompiles(self) -> None:
        """Build `recompiles` (facts.py)."""
        self.fact("recompiles")

    @cached_property
    def breakdown(self) -> pa.Table:
        """Per step window: where the time went (ns), one partition of the step (breakdown.py)
        and the host view (facts.step_breakdown)."""
        return facts.step_breakdown(self)

    @property
    def explained_idle(self) -> pa.Table:
        """Per step window (rank, start_ns): device idle time that overlaps explained host time,
        which the more specific rules (compile, fallback, sync, data loading) report."""
        return self.arrow("SELECT * FROM explained_idle ORDER BY rank, start_ns")


_FACT_NAME = re.compile(r"\b(" + "|".join(sorted(facts.TABLES, key=len, reverse=True)) + r")\b")

"""Shared, cached facts about one profile that several rules and the summary need: a DuckDB
connection over its tables, the step windows, and the device's busy intervals.

Everything here is computed in DuckDB over columns; results are cached per `Profile` object so
that running every rule scans the events a few times, not once per rule.
"""

from __future__ import annotations

import threading
import weakref
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from ..model.schema import EVENTS
from . import intervals
from .columns import Columns
from .conventions import (
    ARGS_KINDS,
    DATALOADER_LIKE,
    DEVICE_WORK_KINDS,
    DOWNCAST_EVENT,
    FUSED_OPTIMIZER_LIKE,
    GRAPH_RECOMPILE_SQL,
    KERNEL_KINDS,
    NEURON_SYNC_KIND,
    OPTIMIZER_STEP_LIKE,
    RECOMPILE_PREDICATE,
    SYNC_RUNTIME_NAMES,
    TRACE_COMPILE_NAMES,
    sql_list,
    sync_predicate,
)

if TYPE_CHECKING:
    import duckdb

HEAVY_COLUMNS = ("args", "shapes", "dtypes")  # long text; only some rules read them
UNUSED_COLUMNS = ("stack_id",)  # nothing reads it; not decoded
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
    """DuckDB views and tables over one profile, built lazily:

    - `ev`: the events table;
    - `steps_w(rank, step, s, e)`: step windows (one window per rank over all its events when
      the profile has no ProfilerStep spans; step is NULL then);
    - `busy(rank, s, e)`: disjoint intervals where the rank's device does any work.
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.manifest = profile.manifest
        self.lock = threading.RLock()  # one rule or summary at a time (the web serves threads)
        self._subsets: set[str] = set()

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
        heavy = self.profile.table("events", columns=list(HEAVY_COLUMNS)) if wanted else None
        keep_arr = pa.array(keep)
        for name in HEAVY_COLUMNS:
            if heavy is not None and heavy[name].null_count < heavy.num_rows:
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

    @cached_property
    def cols(self) -> Columns:
        """numpy views of `events` (columns.py) for the array-wise parts of the analysis."""
        self.events  # noqa: B018 - builds them
        return self._cols

    @cached_property
    def con(self) -> duckdb.DuckDBPyConnection:
        con = self.profile.duckdb()
        # every rule queries `ev`, the Arrow table above (scanned in place, not copied)
        con.register("ev", self.events)
        return con

    def run(self, sql: str) -> None:
        """Run a statement (DDL) to completion; DuckDB wants every result drained."""
        self.con.execute(sql).fetchall()

    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Run SQL and return the rows as dicts (for small, aggregated results only)."""
        cur = self.con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def one(self, sql: str, params: list[Any] | None = None) -> dict[str, Any]:
        rows = self.rows(sql, params)
        return rows[0] if rows else {}

    def arrow(self, sql: str, params: list[Any] | None = None) -> pa.Table:
        return plain_types(self.con.sql(sql, params=params or None).to_arrow_table())

    @property
    def device_spec(self) -> dict[str, Any]:
        return dict(self.manifest.device_spec or {})

    @cached_property
    def has_steps(self) -> bool:
        return bool(self._steps_ready)

    @cached_property
    def _steps_ready(self) -> int:
        """Create `steps_w`; returns the number of real (ProfilerStep) windows."""
        self.run(
            """CREATE TEMP TABLE steps_w AS
            SELECT rank, coalesce(step, TRY_CAST(regexp_extract(name, '#(\\d+)', 1) AS INTEGER))
                       AS step,
                   min(start_ns) AS s, max(start_ns + dur_ns) AS e
            FROM ev WHERE kind = 'step' AND layer = 'host'
            GROUP BY ALL"""
        )
        n = self.con.execute("SELECT count(*) FROM steps_w").fetchall()[0][0]
        if n == 0:
            self.run(
                """INSERT INTO steps_w
                SELECT rank, NULL, min(start_ns), max(start_ns + dur_ns) FROM ev GROUP BY rank"""
            )
        return int(n)

    def steps(self) -> pa.Table:
        """Step windows: rank, step, start_ns, dur_ns (ordered)."""
        self._steps_ready  # noqa: B018 - builds steps_w
        return self.arrow(
            "SELECT rank, step, s AS start_ns, e - s AS dur_ns FROM steps_w ORDER BY rank, s"
        )

    @cached_property
    def total_step_ns(self) -> int:
        """Sum of step durations over all ranks: the denominator of every saving share."""
        self._steps_ready  # noqa: B018
        v = self.con.execute("SELECT coalesce(sum(e - s), 0) FROM steps_w").fetchall()[0][0]
        return int(v)

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
        a query about a few kinds of events scans those rather than every event."""
        self.con.register(name, self.events.filter(pa.array(rows)))
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
            self._subsets.add(self.subset(name, rows))
        return name

    def merged_rows(self, name: str, rows: np.ndarray) -> pa.Table:
        """Merge the spans of the `rows` of `ev` into disjoint intervals per rank, register them
        as table `name` (rank, s, e) and return them."""
        cols = self.cols
        at = np.flatnonzero(rows)
        rank = cols.ints("rank")[at]
        try:
            first, s, e = intervals.merge_arrays(rank, cols.ints("start_ns")[at], cols.end()[at])
        except OverflowError:  # spans too wide for the int64 shift: let DuckDB do it
            self.subset(f"{name}_src", rows)
            return self.merged(
                name, f"SELECT rank, start_ns AS s, start_ns + dur_ns AS e FROM {name}_src"
            )
        table = pa.table({"rank": self.events["rank"].take(pa.array(at[first])), "s": s, "e": e})
        self.con.register(name, table)
        return table

    def merged(self, name: str, source: str, part: str = "rank") -> pa.Table:
        """Merge the intervals (columns s, e) that `source` selects into disjoint ones per
        `part` lane, register them as table `name` and return them."""
        cols = [c.strip() for c in part.split(",")]
        try:
            table = intervals.merge(self.arrow(source), cols)
        except OverflowError:  # spans too wide for the int64 shift: let DuckDB do it
            table = self.arrow(merged_intervals_sql(source, part))
        self.con.register(name, table)
        return table

    def _merge_device(self, table: str, kinds: tuple[str, ...]) -> None:
        self.merged_rows(table, self.device_rows(kinds))

    @cached_property
    def _busy_ready(self) -> bool:
        self._merge_device("busy", DEVICE_WORK_KINDS)
        return True

    def ensure_busy(self) -> None:
        self._busy_ready  # noqa: B018

    @cached_property
    def breakdown(self) -> pa.Table:
        """Per step window: where the time went (ns), one partition of the step (breakdown.py:
        device compute + communication + dma + idle by host cause = dur_ns) and the overlaps
        shown apart; and the host view: compile, fallback and sync wait (events of those kinds
        clipped to the step) and host_other_ns, the rest. Device columns (and device_idle_ns)
        are NULL on ranks without device work.
        """
        from .breakdown import DEVICE_COLUMNS, OVERLAP_COLUMNS, PARTITION_COLUMNS, per_step

        self._steps_ready  # noqa: B018
        self.ensure_busy()

        windows = self.arrow("SELECT rank, s, s AS ws, e AS we FROM steps_w")
        step_dev = pa.table(
            {
                "rank": windows["rank"],
                "s": windows["s"],
                "ns_busy": intervals.covered(self.arrow("SELECT * FROM busy"), ["rank"], windows),
            }
        )
        self.con.register("step_dev", step_dev)

        cols = self.cols
        host = cols.where("layer", ("host",))
        sync_rows = (cols.where("kind", (NEURON_SYNC_KIND,)) & host) | (
            cols.where("kind", ("runtime",)) & cols.where("name", SYNC_RUNTIME_NAMES)
        )
        # the few events these joins read, not every event
        self.subset("ev_host_x", host & (cols.where("kind", ("compile", "fallback")) | sync_rows))
        kernels = self.events_of(KERNEL_KINDS, "device")  # the rules' table of kernels too

        def host_kind(pred: str) -> str:
            return f"""SELECT w.rank, w.s,
                    sum(least(x.start_ns + x.dur_ns, w.e) - greatest(x.start_ns, w.s)) AS ns
                FROM steps_w w JOIN ev_host_x x ON x.rank = w.rank AND x.layer = 'host' AND {pred}
                     AND x.start_ns < w.e AND x.start_ns + x.dur_ns > w.s
                GROUP BY ALL"""

        sync_pred = sync_predicate("x")
        device_ranks = sorted(self.device_ranks) or [-(2**31)]
        ranks_sql = "(" + ", ".join(str(r) for r in device_ranks) + ")"
        sql = f"""
        WITH busy_w AS (SELECT rank, s, ns_busy AS ns FROM step_dev),
        comp_k AS ({host_kind("x.kind = 'compile'")}),
        fall_k AS ({host_kind("x.kind = 'fallback'")}),
        sync_k AS ({host_kind(sync_pred)}),
        kern AS (SELECT w.rank, w.s, count(*) AS n
                 FROM (SELECT rank, start_ns FROM {kernels} WHERE layer = 'device'
                       AND kind IN {sql_list(KERNEL_KINDS)}) k
                 ASOF JOIN steps_w w ON k.rank = w.rank AND k.start_ns >= w.s
                 WHERE k.start_ns < w.e GROUP BY ALL)
        SELECT w.rank, w.step, w.s AS start_ns, w.e - w.s AS dur_ns,
               w.rank IN {ranks_sql} AS has_device,
               CASE WHEN w.rank IN {ranks_sql} THEN (w.e - w.s) - coalesce(b.ns, 0) END
                   AS device_idle_ns,
               coalesce(ck.ns, 0) AS compile_ns, coalesce(fk.ns, 0) AS fallback_ns,
               coalesce(sk.ns, 0) AS sync_ns,
               greatest((w.e - w.s) - coalesce(ck.ns, 0) - coalesce(fk.ns, 0)
                        - coalesce(sk.ns, 0), 0) AS host_other_ns,
               coalesce(k.n, 0) AS kernels
        FROM steps_w w
        LEFT JOIN busy_w b USING (rank, s)
        LEFT JOIN comp_k ck USING (rank, s) LEFT JOIN fall_k fk USING (rank, s)
        LEFT JOIN sync_k sk USING (rank, s) LEFT JOIN kern k USING (rank, s)
        ORDER BY w.rank, w.s
        """
        table = self.arrow(sql)
        # the partition, for the same windows in the same order
        ordered = self.arrow("SELECT rank, s AS ws, e AS we FROM steps_w ORDER BY rank, s")
        parts = per_step(self, ordered)
        has_device = table["has_device"].to_numpy(zero_copy_only=False)
        for name in (*PARTITION_COLUMNS, *OVERLAP_COLUMNS):
            values = parts[name]
            mask = ~has_device if name in DEVICE_COLUMNS else None
            table = table.append_column(name, pa.array(values, pa.int64(), mask=mask))
        return table.drop_columns(["has_device"])

    @cached_property
    def _recompiles_ready(self) -> bool:
        self._steps_ready  # noqa: B018
        compiles = self.subset("ev_compiles", self.cols.where("kind", ("compile",)))
        self.run(
            f"""CREATE TEMP TABLE recompiles AS
            WITH r AS (SELECT rank, e, row_number() OVER (PARTITION BY rank ORDER BY s) AS i,
                              count(*) OVER (PARTITION BY rank) AS n FROM steps_w),
                 f AS (SELECT rank, e AS first_end FROM r WHERE i = 1 AND n >= 2
                       AND {int(self.has_steps)} = 1)
            SELECT ev.* FROM {compiles} AS ev LEFT JOIN f USING (rank)
            WHERE {RECOMPILE_PREDICATE}
               OR (kind = 'compile' AND layer = 'host'
                   AND (start_ns >= f.first_end OR {GRAPH_RECOMPILE_SQL}))"""
        )
        return True

    def ensure_recompiles(self) -> None:
        """Build `recompiles`: compile events caused by shapes not seen before: the neuron
        compiler's recompile markers, compiles of a graph's later signatures, and any compile
        after the first step of a rank (the first step compiles everything once)."""
        self._recompiles_ready  # noqa: B018

    @cached_property
    def _explained_ready(self) -> bool:
        """`explained(rank, s, e)`: host time with a known cause of device idleness (compiles,
        torch.compile's tracing, CPU fallbacks, syncs and data loading), merged per rank."""
        cols = self.cols
        kind = cols.where
        rows = cols.where("layer", ("host",)) & (
            kind("kind", ("compile", "fallback", NEURON_SYNC_KIND))  # sync_predicate()
            | (kind("kind", ("runtime",)) & kind("name", SYNC_RUNTIME_NAMES))
            | (kind("kind", ("annotation", "op")) & cols.like("name", DATALOADER_LIKE))
            | (kind("kind", ("op", "annotation")) & kind("name", TRACE_COMPILE_NAMES))
        )
        self.merged_rows("explained", rows)
        return True

    @cached_property
    def explained_idle(self) -> pa.Table:
        """Per step window (rank, start_ns): device idle time that overlaps explained host time,
        which the more specific rules (compile, fallback, sync, data loading) report."""
        self._steps_ready  # noqa: B018
        self.ensure_busy()
        self._explained_ready  # noqa: B018
        pieces = self.arrow(
            """SELECT w.rank, w.s, greatest(x.s, w.s) AS ws, least(x.e, w.e) AS we
            FROM steps_w w JOIN explained x ON x.rank = w.rank AND x.s < w.e AND x.e > w.s"""
        )
        busy = intervals.covered(self.arrow("SELECT * FROM busy"), ["rank"], pieces)
        self.con.register(
            "explained_pieces", pieces.append_column("busy_ns", pa.array(busy, pa.int64()))
        )
        return self.arrow(
            """WITH ex AS (SELECT rank, s, sum(we - ws) - sum(busy_ns) AS ns
                        FROM explained_pieces GROUP BY rank, s)
            SELECT w.rank, w.s AS start_ns, coalesce(ex.ns, 0) AS explained_idle_ns
            FROM steps_w w LEFT JOIN ex USING (rank, s)
            ORDER BY w.rank, w.s"""
        )

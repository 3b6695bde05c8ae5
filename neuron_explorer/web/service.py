"""What every route of one server shares: the served profiles, what is derived from them (in
memory, and on disk for what takes seconds), the background analysis, the warm-up after start
and the SQL gate. Routes read values through a `Service`; they never hold state of their own."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from neuron_explorer.analysis import stored
from neuron_explorer.analysis.context import context
from neuron_explorer.analysis.scoped import scope_line, scope_of
from neuron_explorer.model import Profile
from neuron_explorer.model.excerpt import open_excerpt

from . import cache_dir
from .cache import AnalysisCache, profile_identity
from .listing import ProfileList
from .memory import EVENT_BYTES, MemoryCeiling, OverMemory, default_ceiling, rss_bytes
from .store import EXCERPT, NotFound, ProfileStore
from .views import compare, operators, overview, search, source, sql, timeline

# The profile list analyses profiles up to this size on the spot (well under a second each), for
# up to LIST_INLINE_S per request; the others show their top finding once known (from the disk
# cache, or a background analysis), so a folder of many or large profiles lists at once.
LIST_INLINE_EVENTS = 200_000
LIST_INLINE_S = 1.0
FIRST_VIEW_PX = 1500  # the timeline route's default width, the one warm_up computes
WARM_SHARE = 0.5  # warm-up stops once the server holds this share of its memory ceiling
DUCKDB_SHARE = 4  # each web DuckDB connection may use a quarter of the ceiling
# The timeline and find of a profile over the ceiling read it in batches: such a pass (the
# index, the whole view, the name counts) needs up to STREAM_BYTES (measured on the 1 GB trace's
# profile, 3.9 M events in row groups of 65,536: peaks 240-330 MB over what the process held),
# or half the whole profile's need when less. A window whose rows (its row groups') need over
# WINDOW_SHARE of the ceiling at WINDOW_EVENT_BYTES each (measured: under 220 B an event for
# windows of 0.2-0.8 M events) is read in batches too.
STREAM_BYTES = 320 << 20
# find reads a column a row group at a time: the name counts and a find of the 1 GB trace's
# profile peak 50-60 MB over what the process held
FIND_BYTES = 96 << 20
WINDOW_SHARE = 0.25
WINDOW_EVENT_BYTES = 256


class Service:
    """The profiles under `root` and everything the pages derive from them; analysis results
    persist under `analysis_cache` (default: the user cache, web/cache.py)."""

    def __init__(
        self,
        root: str | Path,
        analysis_cache: str | Path | None = None,
        max_memory: int | None = None,
    ) -> None:
        self._held_at_start = rss_bytes()  # the interpreter and its libraries, no profile yet
        self.store = ProfileStore(root)
        self.memory = MemoryCeiling(max_memory or default_ceiling(), self.store.forget)
        self.store.before_compute = self._admit
        self.store.running = self.memory.running
        self._admitted: weakref.WeakSet[Profile] = weakref.WeakSet()
        self.store.duckdb_memory = self.memory.limit // DUCKDB_SHARE
        self.disk = AnalysisCache(analysis_cache or cache_dir() / "analysis")
        self.gate = sql.QueryGate()
        self.listing = ProfileList()
        # one profile analysed at a time in the background, leaving the other core to requests
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="analysis")
        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tables")
        self._pending: set[str] = set()
        self._pending_lock = threading.Lock()
        # a window of a profile over the ceiling holding more events than this is merged from
        # its level-of-detail pyramid (once warm_up built it); the levels' widths: extent/2^k
        self.lod_events = timeline.LOD_EVENTS
        self.lod_shifts = timeline.LEVEL_SHIFTS

    def refuse_if_over_memory(self) -> None:
        """OverMemory (503) while the process is past its ceiling and letting go of what it
        keeps does not bring it back under."""
        if self.memory.over():
            self.memory.admit(0, "this request")

    # ---- which profile the analysis pages read ---------------------------------------------
    def analysed(self, name: str) -> str:
        """The name the analysis pages read for profile `name`: its excerpt's (`NAME/excerpt`,
        model/excerpt.py) when the import cut one and the whole profile's tables (web/memory.py)
        would not fit in what the ceiling leaves beside the server itself (what it held when
        it started), else `name` itself. Timeline, find and SQL read `name`."""
        if name.endswith(EXCERPT):
            return name

        def decide(p: Profile) -> str:
            need = p.footer_rows.get("events", 0) * EVENT_BYTES + p.footer_bytes
            if need <= self.memory.limit - self._held_at_start:
                return name
            return name + EXCERPT if open_excerpt(p) is not None else name

        return self.store.derived(name, "analysed", decide, admit=False)

    def scope(self, name: str) -> dict[str, Any] | None:
        """What the analysis pages of `name` (as `analysed` gave it) cover, with its `line` of
        text; None for a whole profile."""
        if not name.endswith(EXCERPT):
            return None
        scope = scope_of(self.store.open(name))
        if scope is None:
            return None
        line = f"{scope_line(scope)}; timeline, find and SQL show the whole profile"
        return {**scope, "line": line}

    # ---- cached per profile ---------------------------------------------------------------
    def admit(self, name: str) -> None:
        """What every route's first reading of a profile passes (for work that reads it
        outside the routes, as the MCP report does): its values' bounds and the ceiling."""
        self._admit(name, self.store.open(name))

    def _admit(self, name: str, p: Profile) -> None:
        """Before a profile's tables are read: no name longer than bounds.MAX_VALUE_BYTES
        (422), and its tables' memory, when nothing of it is in memory yet, must fit under the
        ceiling (web/memory.py; 503); the server goes on serving."""
        p.check_values()  # once per opened profile: a 20 MB name is refused, not decoded
        rows = p.footer_rows.get("events", 0)
        need = 0 if p in self._admitted else rows * EVENT_BYTES + p.footer_bytes
        self.memory.admit(need, f"{name} ({rows:,} events)", keep=name)
        self._admitted.add(p)  # until the store lets it go (a new version, or memory)

    def persisted(
        self, name: str, kind: str, compute: Callable[[Profile], Any], reads: str | None = None,
        admit: Callable[[str, Profile], None] | None = None,
    ) -> Any:  # fmt: skip
        """A value kept in memory and in the disk cache, keyed by the profile's identity; the
        analysis the import left in the profile (analysis/stored.py) is read first. `reads`:
        the stored kind `compute` starts from, when it has one (then no tables are read);
        `admit`: what computing it must pass (default: the whole profile under the ceiling)."""
        store, disk = self.store, self.disk

        def make(p: Profile) -> Any:
            if kind in stored.KINDS:  # left in the profile by the import (exact, or ignored)
                value = self._stored(name, p, kind)
                if value is not None:
                    return value
            identity = store.derived(name, "identity", profile_identity, admit=False)
            value = disk.load(p, kind, identity)
            if value is None:
                if reads is None or self._stored(name, p, reads) is None:
                    (admit or self._admit)(name, p)  # only now are the tables read
                value = compute(p)
                disk.store(p, kind, identity, value)
            return value

        return store.derived(name, kind, make, admit=False)

    def index(self, name: str) -> timeline.TimelineIndex:
        """The timeline's index: in memory when the whole profile fits under the ceiling, else
        streamed in batches (no per-event arrays: every window then reads its row groups)."""
        store = self.store

        def make(p: Profile) -> timeline.TimelineIndex:
            try:
                self._admit(name, p)
            except OverMemory:  # too big to hold: what a pass in batches needs, instead
                return self._streamed_index(name, p)
            return timeline.build_index(p, store.connection(name))

        return store.derived(name, "timeline", make, admit=False)

    def _streamed_index(self, name: str, p: Profile) -> timeline.TimelineIndex:
        """The index built in batches, kept in the disk cache too (tens of seconds on a 10 GB
        trace's profile: a restart reads it back)."""
        identity = self.store.derived(name, "identity", profile_identity, admit=False)
        kinds = ("timeline_meta", "timeline_lanes_table", "timeline_long_table")
        meta, lanes, long = (self.disk.load(p, kind, identity) for kind in kinds)
        if meta is not None and lanes is not None and long is not None:
            return timeline.index_from_parts(p, meta, lanes, long)
        self._admit_batch(name, p)
        idx = timeline.build_index_streamed(p)
        for kind, value in zip(kinds, timeline.index_parts(idx), strict=True):
            self.disk.store(p, kind, identity, value)
        return idx

    def window(
        self, name: str, start_ns: int, end_ns: int, width_px: int
    ) -> timeline.TimelineWindow:
        """A timeline window; on a streamed index admitted by what it reads: the rows of its
        row groups when they fit a WINDOW_SHARE of the ceiling, else one batch at a time."""
        p, idx = self.store.open(name), self.index(name)
        con = self.store.connection(name)
        if len(idx.event_lane):  # the whole profile was admitted with its index
            return timeline.window(p, con, idx, start_ns, end_ns, width_px)
        rows = timeline.window_rows(p, idx, start_ns, end_ns)
        pyr = self.pyramid(name, build=False) if rows > self.lod_events else None
        if pyr is not None:  # its edges read as events: a few pixels' worth
            self.memory.admit(FIND_BYTES, f"a window of {name} from its pyramid", keep=name)
            win = timeline.lod_window(p, con, idx, pyr, start_ns, end_ns, width_px)
            if win is not None:
                return win
        need = rows * WINDOW_EVENT_BYTES
        batched = need > WINDOW_SHARE * self.memory.limit
        with self.memory.running():
            if batched:
                self._admit_batch(name, p, f"a window of {name} ({rows:,} events, in batches)")
            else:
                self.memory.admit(need, f"a window of {name} ({rows:,} events)", keep=name)
            return timeline.window(p, con, idx, start_ns, end_ns, width_px, batched=batched)

    def pyramid(self, name: str, build: bool = True) -> timeline.Pyramid | None:
        """The level-of-detail pyramid of a profile over the ceiling (analysis/timeline_lod.py),
        kept in memory and in the disk cache; None when not built and not `build`."""
        p, store = self.store.open(name), self.store
        kinds = ("timeline_lod_meta", "timeline_lod_table")
        kept = all(self.disk.path(p, kind).exists() for kind in kinds)
        if not (build or kept or store.has(name, "timeline-lod")):
            return None  # not built yet (warm_up builds it)

        def make(p: Profile) -> timeline.Pyramid:
            identity = store.derived(name, "identity", profile_identity, admit=False)
            meta, rows = (self.disk.load(p, kind, identity) for kind in kinds)
            if meta is not None and rows is not None:
                return timeline.pyramid_from_parts(meta, rows)
            idx = self.index(name)
            self._admit_batch(name, p, f"the timeline pyramid of {name}")
            pyr = timeline.build_pyramid(p, idx, timeline.default_buckets(idx, self.lod_shifts))
            for kind, value in zip(kinds, timeline.pyramid_parts(pyr), strict=True):
                self.disk.store(p, kind, identity, value)
            return pyr

        return store.derived(name, "timeline-lod", make, admit=False)

    def first_window(self, name: str, width_px: int = FIRST_VIEW_PX) -> timeline.TimelineWindow:
        """The timeline's whole-profile view (the first of every visit), computed once per
        width, rounded to 250 px so a few widths serve every browser (one width, the warm-up's,
        for a profile whose index is streamed)."""
        width_px = min(8000, max(250, round(width_px / 250) * 250))
        if not len(self.index(name).event_lane):  # streamed: each width costs a pass over every
            width_px = FIRST_VIEW_PX  # event (half a minute on a 10 GB trace's); one serves all

        def make(p: Profile) -> timeline.TimelineWindow:
            idx = self.index(name)
            s, e = timeline.first_view(idx)
            if len(idx.event_lane):  # in memory: a second or two from the per-event arrays
                return self.window(name, s, e, width_px)
            # streamed: the whole profile in batches (a minute on a 10 GB trace's), kept on disk
            identity = self.store.derived(name, "identity", profile_identity, admit=False)
            kind = f"timeline_all_{width_px}"
            kept = self.disk.load(p, kind, identity)
            if kept is not None:
                return timeline.window_from_dict(kept)
            win = self.window(name, s, e, width_px)
            self.disk.store(p, kind, identity, win.to_dict())
            return win

        return self.store.derived(name, f"timeline-all-{width_px}", make, admit=False)

    def _admit_batch(self, name: str, p: Profile, what: str = "", need: int = STREAM_BYTES) -> None:
        """What a pass over a profile in batches passes: `need` (or half the whole profile's
        need, when less) under the ceiling."""
        p.check_values()
        whole = p.footer_rows.get("events", 0) * EVENT_BYTES + p.footer_bytes
        self.memory.admit(min(need, whole // 2), what or f"a read of {name} in batches",
                          keep=name)  # fmt: skip

    def name_counts(self, name: str) -> Any:  # pyarrow table: name, events
        """The profile's distinct names with their counts (one streamed pass, kept on disk)."""

        def admit(name: str, p: Profile) -> None:
            self._admit_batch(name, p, f"the names of {name}", FIND_BYTES)

        return self.persisted(name, "name_counts_table", search.name_counts, admit=admit)

    def find(self, name: str, q: str, regex: bool, limit: int) -> dict[str, Any]:
        """Find on the timeline: names matched in the Parquet dictionary when the profile fits
        under the ceiling, else from its name counts, reading a row group at a time."""
        p, con = self.store.open(name), self.store.connection(name)
        try:
            self._admit(name, p)
        except OverMemory:
            counts = self.name_counts(name)
            with self.memory.running():
                self._admit_batch(name, p, f"find in {name}", FIND_BYTES)
                return search.search_events(con, q, regex, limit, p, counts)
        return search.search_events(con, q, regex, limit, p)

    def ops(self, name: str) -> Any:  # pyarrow table
        return self.persisted(
            name, "ops_table", lambda p: operators.operator_table(context(p).cols)
        )

    def lines(self, name: str) -> Any:  # pyarrow table
        return self.persisted(name, "lines_table", lambda p: source.line_table(context(p).cols))

    def model_lines(self, name: str, level: str = "model") -> Any:
        """Device self/total per line of any stacked file, at `level` (user, model, all)."""
        return self.persisted(name, f"lines_table_{level}",
                              lambda p: source.model_line_table(p, p.duckdb(), level))  # fmt: skip

    def kernels(self, name: str) -> Any:  # pyarrow table of kernels by name
        con = self.store.connection(name)
        return self.store.derived(name, "kernel_table", lambda p: compare.kernel_table(con))

    def tables_later(self, name: str) -> None:
        """Start the operator and line tables (numpy, GIL mostly released) on the side thread
        while the calling thread runs the rules."""
        if not (self.store.has(name, "ops_table") and self.store.has(name, "lines_table")):
            self._side.submit(lambda: (self.ops(name), self.lines(name)))

    # neuron_explorer.analysis keeps one DuckDB connection per profile: one analysis call at a time
    def summary(self, name: str) -> dict[str, Any] | None:
        def make(p: Profile) -> dict[str, Any] | None:
            with self.store.profile_lock(name):
                return overview.analysis_summary(p)

        return self.persisted(name, "summary", make)

    def findings_report(self, name: str) -> dict[str, Any]:
        """The findings document (analysis.runner.FindingsReport, as `analyze --json` prints
        it) with the web's file ids, so the page links evidence lines to the source view."""

        def make(p: Profile) -> dict[str, Any]:
            doc = self._stored(name, p, "findings_report")  # left by the import, or None
            if doc is None:
                with self.store.profile_lock(name):
                    doc = overview.analysis_findings_report(p)
            return source.with_file_ids(doc)

        return self.persisted(name, "findings", make, reads="findings_report")

    def _stored(self, name: str, p: Profile, kind: str) -> Any:
        """What the import left in the profile's analysis/ folder, None if missing or stale."""
        return stored.load(
            p, kind, self.store.derived(name, "stored", stored.identity, admit=False)
        )

    def findings(self, name: str) -> list[dict[str, Any]] | None:
        return self.findings_report(name)["findings"]

    def findings_if_quick(self, name: str) -> list[dict[str, Any]] | None:
        """The findings when known or quick (a small profile, as for the list), else None:
        the summary page then shows without them and queues them (analyse_later) after."""
        return self._known_findings(name, self.store.open(name), inline=True)[1]

    def devices(self, name: str) -> list[str]:
        return self.persisted(name, "devices", overview.devices)

    def source_file(self, name: str, file_id: str) -> str:
        """The path of a file the profile's lines name, by id; NotFound otherwise."""
        path = source.find_file(self.lines(name), file_id, self.model_lines(name))
        if path is None:
            raise NotFound(f"no source file {file_id!r} in {name}")
        return path

    # ---- the profile list and the background ----------------------------------------------
    def profile_rows(self) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        """(a row per served profile, the profiles skipped with why); small profiles are
        analysed inline for LIST_INLINE_S in all, the others queued for the background."""
        names, skipped = self.store.scan()
        start = time.monotonic()
        rows = self.listing.rows(names, lambda name: self._profile_row(name, start))
        # after the list is built, which then does not wait for them
        self.analyse_later([r["name"] for r in rows if r.get("analysis_pending")])
        return rows, skipped

    def _profile_row(self, name: str, start: float) -> dict[str, Any]:
        p, a = self.store.open(name), self.analysed(name)
        inline = time.monotonic() - start < LIST_INLINE_S
        known, found = self._known_findings(a, self.store.open(a), inline)
        row = overview.profile_row(name, p, self.devices(a), found)
        return {**row, "analysis_pending": not known}

    def _known_findings(
        self, name: str, p: Profile, inline: bool
    ) -> tuple[bool, list[dict[str, Any]] | None]:
        """The findings if computed (here or by an earlier server), or computed now when
        `inline` and the profile is small; else (False, None), for the background."""
        events = p.row_count("events")  # the footers' count, not the manifest's claim
        if self.store.has(name, "findings") or (inline and events <= LIST_INLINE_EVENTS):
            return True, self.findings(name)
        if self._stored(name, p, "findings_report") is not None:
            return True, self.findings(name)  # the import's, read into memory
        identity = self.store.derived(name, "identity", profile_identity, admit=False)
        if self.disk.load(p, "findings", identity) is not None:
            return True, self.findings(name)  # read back into memory
        return False, None

    def analyse_later(self, names: list[str]) -> None:
        """Queue the analysis of profiles the list could not show yet (one at a time)."""
        with self._pending_lock:
            for name in names:
                if name not in self._pending:
                    self._pending.add(name)
                    self._background.submit(self._analyse, name)

    def _analyse(self, name: str) -> None:
        try:
            a = self.analysed(name)
            self.findings(a), self.summary(a)
        except Exception:  # noqa: BLE001 - a broken profile reports itself when visited
            pass
        finally:
            with self._pending_lock:
                self._pending.discard(name)

    def warm_up(self) -> None:
        """Compute what the first visit of each profile needs (run in a background thread)."""
        for name in self.store.names():
            if rss_bytes() > WARM_SHARE * self.memory.limit:
                return  # the rest is computed when visited
            try:  # the first page first (summary, tables, findings), of what is analysed
                a = self.analysed(name)
                self.summary(a), self.ops(a), self.lines(a), self.findings(a)
            except Exception:  # noqa: BLE001 - a broken profile reports itself when visited
                pass
            try:
                # then the timeline's index and its whole view at the route's default width
                # (1.2-1.6 s CPU on a 1 GB trace; streamed on a profile over the ceiling)
                self.index(name), self.first_window(name)
                if not len(self.index(name).event_lane):  # over the ceiling: find's names,
                    self.name_counts(name)  # and the pyramid wide windows are merged from
                    self.pyramid(name)
            except Exception:  # noqa: BLE001
                continue

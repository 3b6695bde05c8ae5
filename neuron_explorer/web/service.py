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
from .memory import MemoryCeiling, OverMemory, default_ceiling, pages_bytes, rss_bytes, tables_bytes
from .store import EXCERPT, NotFound, ProfileStore
from .views import compare, operators, overview, source, sql, timeline
from .whole_views import WholeProfileViews

# The profile list analyses profiles up to this size on the spot (well under a second each), for
# up to LIST_INLINE_S per request; the others show their top finding once known (from the disk
# cache, or a background analysis), so a folder of many or large profiles lists at once.
LIST_INLINE_EVENTS = 200_000
LIST_INLINE_S = 1.0
WARM_SHARE = 0.5  # warm-up stops once the server holds this share of its memory ceiling
DUCKDB_SHARE = 4  # each web DuckDB connection may use a quarter of the ceiling
# the warm-up builds the pyramid of a profile over the ceiling only when it holds more than this
# many times the events of a window it would answer (lod_events): a 400,000-event profile's
# build peaked past a 400 MB ceiling, for windows that reading their row groups answers anyway
PYRAMID_WINDOWS = 10
# what a page says when it shows a stored analysis an earlier version computed (Service._stored)
STALE = ("; stored by an earlier version of neuron-explorer, which this server's memory ceiling "
         "cannot compute again: `neuron-explorer analyze {path} --store` stores it anew")  # fmt: skip


class Service(WholeProfileViews):
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
        self.store.before_compute = self._admit_page
        self.store.running = self.memory.running
        # bytes admitted per profile, until the store lets it go (a new version, or memory)
        self._admitted: weakref.WeakKeyDictionary[Profile, int] = weakref.WeakKeyDictionary()
        self._stale: set[str] = set()  # served their stale stored analysis (Service._stored)
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
            if tables_bytes(p) <= self.memory.limit - self._held_at_start:
                return name
            return name + EXCERPT if open_excerpt(p) is not None else name

        return self.store.derived(name, "analysed", decide, admit=False)

    def scope(self, name: str) -> dict[str, Any] | None:
        """What the analysis pages of `name` (as `analysed` gave it) cover, with its `line` of
        text, and `stale` when they show a stale stored analysis; None for a whole profile
        analysed by this version."""
        stale = ""
        if name in self._stale:
            stale = STALE.format(path=self.store.open(name.removesuffix(EXCERPT)).path)
        scope = scope_of(self.store.open(name)) if name.endswith(EXCERPT) else None
        if scope is None:
            return {"stale": True, "line": stale[2:]} if stale else None
        line = f"{scope_line(scope)}; timeline, find and SQL show the whole profile{stale}"
        return {**scope, **({"stale": True} if stale else {}), "line": line}

    # ---- cached per profile ---------------------------------------------------------------
    def admit(self, name: str, page: bool = False) -> None:
        """What every route's first reading of a profile passes (for work that reads it
        outside the routes, as the MCP report does): its values' bounds and the ceiling;
        `page`: for an analysis page the import does not store (`_admit_page`)."""
        (self._admit_page if page else self._admit)(name, self.store.open(name))

    def _admit(self, name: str, p: Profile, values: bool = True, page: bool = False) -> None:
        """Before a profile's tables are read: no name longer than bounds.MAX_VALUE_BYTES
        (422; `values` False: the caller checks them once it knows it reads them), and its
        tables' memory, less what was admitted for it already, must fit under the ceiling
        (web/memory.py; 503); the server goes on serving."""
        if values:
            p.check_values()  # once per opened profile: a 20 MB name is refused, not decoded
        rows = p.footer_rows.get("events", 0)
        # an excerpt's pages that the import did not store hold far less than its analysis
        want = pages_bytes(p) if page and name.endswith(EXCERPT) else tables_bytes(p)
        had = self._admitted.get(p, 0)
        self.memory.admit(max(0, want - had), f"{name} ({rows:,} events)", keep=name)
        self._admitted[p] = max(had, want)

    def _admit_page(self, name: str, p: Profile) -> None:
        """`_admit` for a value of a page the import does not store (modules, call tree,
        memory, a source line's panel, critical path, what-if, compare's kernels): an excerpt
        is admitted by what those pages hold (web/memory.py `pages_bytes`), not by its whole
        analysis, so they answer beside the whole profile's timeline."""
        self._admit(name, p, page=True)

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
                    try:
                        # only now are the tables read: the whole analysis for what the
                        # import stores (or reads from it), a page's need for the others
                        full = kind in stored.KINDS or reads is not None
                        (admit or (self._admit if full else self._admit_page))(name, p)
                    except OverMemory as e:  # a stale stored value served instead, or 503
                        self._refused(name, p, kind if kind in stored.KINDS else reads, e)
                        if kind in stored.KINDS:
                            return self._stored(name, p, kind)
                value = compute(p)
                if name not in self._stale:  # (a stale stored value is not cached as current)
                    disk.store(p, kind, identity, value)
            return value

        return store.derived(name, kind, make, admit=False)

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
        """What the import left in the profile's analysis/ folder, None if missing or stale;
        the stale one once the ceiling refused computing it again (`_refused`)."""
        ident = self.store.derived(name, "stored", stored.identity, admit=False)
        value = stored.load(p, kind, ident)
        if value is not None:
            self._stale.discard(name)  # stored anew (analyze --store)
            return value
        return stored.load(p, kind, ident, stale=True) if name in self._stale else None

    def _refused(self, name: str, p: Profile, kind: str | None, e: OverMemory) -> None:
        """Computing `kind` again did not fit: its stale stored value (an earlier version's, of
        these tables) is served instead, and `scope` says so; without one, the 503 says how
        to store it anew when the folder holds one of an older layout."""
        if kind is None or not stored.path(p, kind).is_file():
            raise e
        ident = self.store.derived(name, "stored", stored.identity, admit=False)
        if stored.load(p, kind, ident, stale=True) is None:
            whole = self.store.open(name.removesuffix(EXCERPT)).path
            raise OverMemory(f"{e}; {STALE.format(path=whole)[2:]}") from None
        self._stale.add(name)

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
                if not len(self.index(name).event_lane):  # over the ceiling: its values (a
                    self.store.open(name).check_values()  # zoom reads names), find's names,
                    self.name_counts(name)  # and the pyramid wide windows are merged from
                    events = self.store.open(name).row_count("events")
                    if events > PYRAMID_WINDOWS * self.lod_events:
                        self.pyramid(name)
            except Exception:  # noqa: BLE001
                continue

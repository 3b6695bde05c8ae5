"""The views that show the whole of a profile, whatever its size: the timeline (its index, its
first view, any window, the level-of-detail pyramid) and find. A profile whose tables fit under
the server's ceiling is read into memory; one over it is read in batches, each view admitted by
what it reads (docs/web.md, the memory ceiling). `Service` is made of these and the analysis
pages (web/service.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from neuron_explorer.model import Profile

from .cache import AnalysisCache, profile_identity
from .memory import MemoryCeiling, OverMemory, tables_bytes, trim
from .store import ProfileStore
from .views import search, timeline

NAME_COUNTS = "name_counts_table"  # find's names with their counts, in the disk cache
FIRST_VIEW_PX = 1500  # the timeline route's default width, the one warm_up computes

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
# The pyramid's build holds, beside a pass in batches, its rows: bounded (analysis/timeline_lod.py
# drops its finest levels past the bound) by PYRAMID_SHARE of the ceiling, or, when less, a row
# of PYRAMID_ROW_BYTES per event and level, twice (each sorted once more): the most there can
# be. Its rows follow its buckets more than its events: the 1 GB trace's profile, 3.9 M events,
# 154 MB of rows, peak 396 MB over what the process held; the 10 GB one's, 38 M events, 256 MB,
# peak 542 MB. A pyramid kept on disk is read back in place (its file's bytes).
# A streamed index keeps each row's lane (int16) and depth (int8) while they fit ROWS_SHARE of
# the ceiling (38 M events: 115 MB; under a 2 GB ceiling, up to 89 M events): windows, the whole
# view and the pyramid then read neither the lane columns nor the parents.
ROW_BYTES = 3
ROWS_SHARE = 0.125
PYRAMID_ROW_BYTES = 128  # its fixed columns 59 B, a name and a kind
PYRAMID_SHARE = 0.25
# The flame graph of a span walks its events' nesting in one DuckDB query, held whole (paths of
# names): on the 10 GB trace's excerpt a span of 449,214 events fits a connection of 512 MB, one
# of 898,360 does not, nor do its 1.8 M in 1 GB (benchmarks/README.md, "What the analysis pages
# of an excerpt hold"); so a span of a profile over the ceiling is refused at once past a
# connection's limit at FLAME_ROW_BYTES an event of its row groups.
FLAME_ROW_BYTES = 1024


class WholeProfileViews:
    """The timeline and find of every served profile, in memory or in batches."""

    store: ProfileStore
    memory: MemoryCeiling
    disk: AnalysisCache
    lod_events: int  # a window over the ceiling holding more is merged from the pyramid
    lod_shifts: tuple[int, ...]  # the pyramid's levels: extent / 2^k

    if TYPE_CHECKING:  # Service's (web/service.py)

        def _admit(self, name: str, p: Profile, values: bool = True) -> None: ...

        def persisted(
            self, name: str, kind: str, compute: Callable[[Profile], Any],
            reads: str | None = None, admit: Callable[[str, Profile], None] | None = None,
        ) -> Any: ...  # fmt: skip

    def index(self, name: str) -> timeline.TimelineIndex:
        """The timeline's index: in memory when the whole profile fits under the ceiling, else
        streamed in batches (no per-event arrays: every window then reads its row groups)."""
        store = self.store

        def make(p: Profile) -> timeline.TimelineIndex:
            try:  # the ceiling first: a streamed index kept on disk reads no values (the check
                self._admit(name, p, values=False)  # reads every row group: 3.7 s at 10 GB)
            except OverMemory:  # too big to hold: what a pass in batches needs, instead
                return self._streamed_index(name, p)
            p.check_values()
            return timeline.build_index(p, store.connection(name))

        return store.derived(name, "timeline", make, admit=False)

    def _streamed_index(self, name: str, p: Profile) -> timeline.TimelineIndex:
        """The index built in batches, kept in the disk cache too (tens of seconds on a 10 GB
        trace's profile: a restart reads it back)."""
        identity = self.store.derived(name, "identity", profile_identity, admit=False)
        kinds = ("timeline_meta", "timeline_lanes_table", "timeline_long_table",
                 "timeline_rows_table")  # fmt: skip
        meta, lanes, long, rows = (self.disk.load(p, kind, identity) for kind in kinds)
        if meta is not None and lanes is not None and long is not None and rows is not None:
            return timeline.index_from_parts(p, meta, lanes, long, rows)
        # each row's lane and depth, kept with the index, while they fit ROWS_SHARE of the ceiling
        held = p.row_count("events") * ROW_BYTES
        rows = held <= ROWS_SHARE * self.memory.limit
        self._admit_batch(name, p, extra=held if rows else 0)
        names = search.NameCounter()  # find's name counts from the same pass: kept on disk,
        idx = timeline.build_index_streamed(p, rows=rows, names=names)  # where name_counts looks
        for kind, value in zip(kinds, timeline.index_parts(idx), strict=True):
            self.disk.store(p, kind, identity, value)
        self.disk.store(p, NAME_COUNTS, identity, names.table())
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
        p.check_values()  # once per opened profile (the warm-up's, after the first view)
        rows = timeline.window_rows(p, idx, start_ns, end_ns)
        pyr = self.pyramid(name, build=False) if rows > self.lod_events else None
        if pyr is not None:  # its edges read as events: a few pixels' worth
            self.memory.admit(FIND_BYTES, f"a window of {name} from its pyramid", keep=name)
            win = timeline.lod_window(p, idx, pyr, start_ns, end_ns, width_px)
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

    def check_flame(self, name: str, start_ns: int, end_ns: int) -> None:
        """OverMemory (503), before any row is read, when the flame graph of a span of a profile
        over the ceiling would read more events than a DuckDB connection may hold; the message
        says how much shorter a span would do (the span's totals are still drawn)."""
        p, idx, limit = self.store.open(name), self.index(name), self.store.duckdb_memory
        if len(idx.event_lane) or not limit:
            return  # in memory: the whole profile was admitted
        rows, most = timeline.window_rows(p, idx, start_ns, end_ns), limit // FLAME_ROW_BYTES
        if rows > most:
            raise OverMemory(
                f"the flame graph of this span reads about {rows:,} events, and a query may hold "
                f"about {most:,} (a quarter of --max-memory): refused; select a span of at most "
                f"about {most / rows:.0%} of this one, or serve with a higher --max-memory (its "
                "totals above are of the whole span)"
            )

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
            if kept:  # read back in place: what it holds is the file
                size = self.disk.path(p, kinds[1]).stat().st_size
                self.memory.admit(size, f"the timeline pyramid of {name}", keep=name)
            meta, rows = (self.disk.load(p, kind, identity) for kind in kinds)
            if meta is not None and rows is not None:
                return timeline.pyramid_from_parts(meta, rows)
            idx = self.index(name)
            most = p.row_count("events") * len(self.lod_shifts) * PYRAMID_ROW_BYTES * 2
            bound = int(min(most, PYRAMID_SHARE * self.memory.limit))
            buckets = timeline.default_buckets(idx, self.lod_shifts)
            with self.memory.running():  # reserved until built: a request waits or fits beside
                self._admit_batch(name, p, f"the timeline pyramid of {name}", extra=bound)
                pyr = timeline.build_pyramid(p, idx, buckets, max_bytes=bound)
            trim()  # the build's pieces and sorted copies handed back: RSS holds its rows
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

    def _admit_batch(self, name: str, p: Profile, what: str = "", need: int = STREAM_BYTES,
                     extra: int = 0) -> None:  # fmt: skip
        """What a pass over a profile in batches passes: `need` (or half the whole profile's
        need, when less), and `extra` that the pass keeps, under the ceiling."""
        p.check_values()
        self.memory.admit(min(need, tables_bytes(p) // 2) + extra, what or f"a read of {name} in batches",
                          keep=name)  # fmt: skip

    def name_counts(self, name: str) -> Any:  # pyarrow table: name, events
        """The profile's distinct names with their counts (one streamed pass, kept on disk)."""

        def admit(name: str, p: Profile) -> None:
            self._admit_batch(name, p, f"the names of {name}", FIND_BYTES)

        return self.persisted(name, NAME_COUNTS, search.name_counts, admit=admit)

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

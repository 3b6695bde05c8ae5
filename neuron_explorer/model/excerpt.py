"""An excerpt of a profile too big to analyse whole: a real profile (same schema, written by
ProfileWriter, atomically) in the profile's `analysis/excerpt/` folder, holding a contiguous run
of whole steps taken from the middle of the run (or a stretch of time when it has no steps).

It is read out of core: the events' (rank, start_ns) once to count each step's events, then the
rows of the window only (row-group statistics on start_ns prune the rest), so writing it needs
memory of the excerpt, not of the profile. An event is in the excerpt when its start is in its
rank's window [first chosen step's start, last chosen step's end). Parent ids that point outside
are dropped (the event becomes a root) rather than the ancestors kept: an enclosing span that
runs before and after the window (a training loop's function) would count its whole duration
into the excerpt's host time. A flow id whose other ends are not all inside is dropped too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from .io import SOURCES, ProfileWriter
from .profile import Profile, is_profile

FOLDER = Path("analysis") / "excerpt"  # inside the profile
SCOPE = "excerpt"  # the excerpt's manifest.extra key: what it holds (a page's `scope`)
OF = "excerpt_of"  # manifest.extra: the fingerprint of the profile it was cut from
TIME_BINS = 1024  # a profile without steps is cut at these fractions of its time
BATCH_ROWS = 256 * 1024


@dataclass(frozen=True)
class Window:
    """What an excerpt holds: each rank's [start_ns, end_ns), the steps `first`..`last` (None
    when cut by time), and how many events that is."""

    spans: dict[int, tuple[int, int]]
    first: int | None
    last: int | None
    events: int


def fingerprint(profile: Profile) -> str:
    """What ties an excerpt to its profile: the manifest's bytes and the events' row count (a
    new import replaces the folder, the excerpt with it; this catches a table swapped by hand)."""
    h = hashlib.sha1((profile.path / "manifest.json").read_bytes())
    return f"{profile.row_count('events')}:{h.hexdigest()}"


def excerpt_path(profile: Profile) -> Path:
    return profile.path / FOLDER


def open_excerpt(profile: Profile) -> Profile | None:
    """The profile's excerpt, opened, or None when it has none (or one cut from other data)."""
    path = excerpt_path(profile)
    if not is_profile(path):
        return None
    part = Profile.open(path)
    return part if part.manifest.extra.get(OF) == fingerprint(profile) else None


def scope_of(profile: Profile) -> dict[str, Any] | None:
    """What an analysis of `profile` covers: None for a whole profile, else its excerpt's
    steps, ranks, events, the whole's events and why (a page's `scope` field)."""
    scope = profile.manifest.extra.get(SCOPE)
    return dict(scope) if isinstance(scope, dict) else None


def choose(profile: Profile, max_events: int) -> Window:
    """As many whole steps as hold at most `max_events` events, around the middle step and
    never the first step when there are others (warm-up, compilation); at least one step. A
    profile without steps: the middle stretch of its time that holds at most `max_events`."""
    steps = profile.manifest.steps
    if not steps:
        return _by_time(profile, max_events)
    numbers = sorted({s.step for s in steps})
    # per rank, its steps by number: (numbers, starts, ends), so a window is two searches
    rows: dict[int, list[tuple[int, int, int]]] = {}
    for s in steps:
        rows.setdefault(s.rank, []).append((s.step, s.start_ns, s.start_ns + s.dur_ns))
    by_rank: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for r, mine in sorted(rows.items()):
        table = np.array(sorted(mine), np.int64).reshape(-1, 3)
        by_rank[r] = (table[:, 0], table[:, 1], table[:, 2])
    edges = {r: np.unique(np.concatenate([st, en])) for r, (_, st, en) in by_rank.items()}
    counts = _histograms(profile, edges)
    cum = {r: np.concatenate([[0], np.cumsum(c)]) for r, c in counts.items()}

    def window(lo: int, hi: int) -> tuple[dict[int, tuple[int, int]], int]:
        spans, n = {}, 0
        for r, (nums, st, en) in by_rank.items():
            a, b = np.searchsorted(nums, numbers[lo]), np.searchsorted(nums, numbers[hi], "right")
            if a == b:
                continue
            s0, e0 = int(st[a:b].min()), int(en[a:b].max())
            spans[r] = (s0, e0)
            # bin k holds edges[k-1] <= start < edges[k]: the window is bins pos(s0)+1..pos(e0)
            e = edges[r]
            n += int(cum[r][np.searchsorted(e, e0) + 1] - cum[r][np.searchsorted(e, s0) + 1])
        return spans, n

    lo = hi = len(numbers) // 2
    spans, n = window(lo, hi)
    floor = 1 if len(numbers) > 1 else 0
    grew = True
    while grew:
        grew = False
        for a, b in ((lo, hi + 1), (lo - 1, hi)):
            if floor <= a and b < len(numbers):
                s2, n2 = window(a, b)
                if n2 <= max_events:
                    lo, hi, spans, n, grew = a, b, s2, n2, True
    return Window(spans, numbers[lo], numbers[hi], n)


def _histograms(profile: Profile, edges: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Per rank, how many events start in each bin of its edges (one pass over two columns).
    Events are in (rank, start_ns) order (model/io.py), so a batch is a few runs of one rank
    with sorted starts, and each edge inside a run is found by a binary search of the run:
    a search an edge, not one an event (at 10 GB, 38 M events in 258 K bins)."""
    counts = {r: np.zeros(len(e) + 1, np.int64) for r, e in edges.items()}
    for batch in profile.dataset("events").to_batches(columns=["rank", "start_ns"],
                                                       batch_size=BATCH_ROWS):  # fmt: skip
        rank = batch.column(0).to_numpy()
        start = batch.column(1).to_numpy()
        cut = np.flatnonzero(rank[1:] != rank[:-1]) + 1
        for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(rank)], strict=True):
            r = int(rank[a]) if b > a else None
            if r not in edges:
                continue
            run, e = start[a:b], edges[r]
            if np.any(run[1:] < run[:-1]):  # not in order: an event at a time
                idx = np.searchsorted(e, run, side="right")
                counts[r] += np.bincount(idx, minlength=len(e) + 1)
                continue
            # bin k holds e[k-1] <= start < e[k]: the run's events below each edge inside it
            lo, hi = np.searchsorted(e, run[0], "right"), np.searchsorted(e, run[-1], "right")
            below = np.searchsorted(run, e[lo:hi], side="left")
            counts[r][lo : hi + 1] += np.diff(below, prepend=0, append=len(run))
    return counts


def _by_time(profile: Profile, max_events: int) -> Window:
    """The middle stretch of the profile's time holding at most `max_events` events (one bin of
    TIME_BINS at least), the same for every rank."""
    data = profile.dataset("events")
    lo_t = hi_t = None
    for batch in data.to_batches(columns=["start_ns"], batch_size=BATCH_ROWS):
        if batch.num_rows:
            mn, mx = pc.min_max(batch.column(0)).values()
            lo_t = mn.as_py() if lo_t is None else min(lo_t, mn.as_py())
            hi_t = mx.as_py() if hi_t is None else max(hi_t, mx.as_py())
    if lo_t is None or hi_t is None:
        return Window({}, None, None, 0)
    edges = np.linspace(lo_t, hi_t + 1, TIME_BINS + 1).astype(np.int64)
    counts = np.zeros(TIME_BINS + 2, np.int64)
    for batch in data.to_batches(columns=["start_ns"], batch_size=BATCH_ROWS):
        idx = np.searchsorted(edges, batch.column(0).to_numpy(), side="right")
        counts += np.bincount(idx, minlength=TIME_BINS + 2)
    per_bin = counts[1 : TIME_BINS + 1]  # bin k: edges[k] <= start < edges[k+1]
    a = b = TIME_BINS // 2
    n = int(per_bin[a])
    while True:
        grown = [(a, b + 1), (a - 1, b)]
        fits = [(x, y) for x, y in grown
                if 0 <= x and y < TIME_BINS and int(per_bin[x : y + 1].sum()) <= max_events]  # fmt: skip
        if not fits:
            break
        a, b = fits[0]
        n = int(per_bin[a : b + 1].sum())
    span = (int(edges[a]), int(edges[b + 1]))
    return Window({r: span for r in profile.manifest.ranks}, None, None, n)


def write_excerpt(profile: Profile, window: Window, why: str) -> Profile:
    """Write the events of `window`, the stacks they use, the counters in it, the graphs and
    the kept sources into the profile's analysis/excerpt/ (replacing one there), and open it."""
    events = _events(profile, window)
    ids = pc.unique(events.column("stack_id").drop_null())
    stacks = profile.table("stacks", filter=pc.field("stack_id").isin(ids))
    counters = _in_window(profile.dataset("counters"), window, "ts_ns")
    ranks = tuple(sorted(window.spans)) or profile.manifest.ranks
    first, last = window.first, window.last
    steps = tuple(s for s in profile.manifest.steps if first is not None and last is not None
                  and first <= s.step <= last and s.rank in window.spans)  # fmt: skip
    scope = {
        "steps": None if window.first is None else [window.first, window.last],
        "step_count": len({s.step for s in steps}),
        "window_ns": None
        if window.first is not None or not window.spans
        else list(next(iter(window.spans.values()))),
        "ranks": len(ranks),
        "events": events.num_rows,
        "of_events": profile.row_count("events"),
        "of_steps": len({s.step for s in profile.manifest.steps}),
        "why": why,
    }
    extra = {**profile.manifest.extra, SCOPE: scope, OF: fingerprint(profile)}
    manifest = replace(profile.manifest, ranks=ranks, steps=steps, extra=extra)
    path = excerpt_path(profile)
    with ProfileWriter(path, overwrite=True) as w:
        w.write_events(events)
        w.write_table("stacks", stacks)
        w.write_table("counters", counters)
        graphs = profile.optional_table("graphs")
        if graphs is not None:
            w.write_table("graphs", graphs)
        for file in _sources(profile.path / SOURCES):
            text = file.read_text(encoding="utf-8", errors="replace")
            w.add_source(f"/{file.relative_to(profile.path / SOURCES)}", text)
        w.commit(manifest)
    return Profile.open(path)


def _events(profile: Profile, window: Window) -> pa.Table:
    """The window's events, their parent ids inside it or dropped, their flow ids dropped when
    any event of the flow is outside."""
    data = profile.dataset("events")
    events = _in_window(data, window, "start_ns")
    if events.num_rows == 0:
        return events
    inside = pc.is_in(events.column("parent_id"), value_set=events.column("id"))
    parent = pc.if_else(inside, events.column("parent_id"), pa.scalar(None, pa.int64()))
    events = events.set_column(events.schema.get_field_index("parent_id"), "parent_id", parent)
    flows = events.column("flow_id").drop_null().to_numpy()
    if len(flows):
        here, n_here = np.unique(flows, return_counts=True)
        _, n_whole = _counts_in(data, "flow_id", here)
        complete = here[n_whole == n_here]
        keep = pc.is_in(events.column("flow_id"), value_set=pa.array(complete, pa.int64()))
        flow = pc.if_else(keep, events.column("flow_id"), pa.scalar(None, pa.int64()))
        events = events.set_column(events.schema.get_field_index("flow_id"), "flow_id", flow)
    return events


def _counts_in(data: ds.Dataset, column: str, values: np.ndarray) -> tuple[np.ndarray, ...]:
    """(`values`, sorted, unique; how many rows of the whole table hold each in `column`), one
    column read: a binary search a row (a dataset `isin` filter hashes the set again for every
    row group), of the row groups whose statistics overlap the values' range only (a window's
    flow ids are the ids of events near it: a few row groups of the whole table)."""
    counts = np.zeros(len(values), np.int64)
    if not len(values):
        return values, counts
    for part in _row_groups_within(data, column, int(values[0]), int(values[-1])):
        for batch in part.to_batches(schema=data.schema, columns=[column], batch_size=BATCH_ROWS):
            col = batch.column(0).drop_null().to_numpy()
            idx = np.minimum(np.searchsorted(values, col), len(values) - 1)
            hit = values[idx] == col
            counts += np.bincount(idx[hit], minlength=len(values))
    return values, counts


def _row_groups_within(data: ds.Dataset, column: str, lo: int, hi: int) -> list[Any]:
    """Each file of `data` reduced to its row groups whose `column` statistics overlap
    [lo, hi] (a dataset filter on a column with nulls reads every row group: pyarrow 26)."""
    parts = []
    for fragment in data.get_fragments():
        fragment.ensure_complete_metadata()
        keep = []
        for group in fragment.row_groups:
            st = (group.statistics or {}).get(column)
            if not st or st.get("min") is None or (st["min"] <= hi and st["max"] >= lo):
                keep.append(group.id)
        if keep:
            parts.append(fragment.subset(row_group_ids=keep))
    return parts


def _in_window(data: ds.Dataset, window: Window, time: str) -> pa.Table:
    """The rows of `data` whose `time` is in their rank's window (the union of the windows
    filters row groups by their statistics; each batch is then masked by rank)."""
    schema = data.schema
    if not window.spans:
        return schema.empty_table()
    lo = min(s for s, _ in window.spans.values())
    hi = max(e for _, e in window.spans.values())
    ranks = np.array(sorted(window.spans), np.int64)
    starts = np.array([window.spans[r][0] for r in ranks], np.int64)
    ends = np.array([window.spans[r][1] for r in ranks], np.int64)
    keep = []
    where = (pc.field(time) >= lo) & (pc.field(time) < hi)
    for batch in data.to_batches(filter=where, batch_size=BATCH_ROWS):
        rank = batch.column("rank").to_numpy().astype(np.int64)
        t = batch.column(time).to_numpy()
        i = np.clip(np.searchsorted(ranks, rank), 0, len(ranks) - 1)
        mask = (ranks[i] == rank) & (t >= starts[i]) & (t < ends[i])
        if mask.any():
            keep.append(batch.filter(pa.array(mask)))
    if not keep:
        return schema.empty_table()
    return pa.Table.from_batches(keep, schema=schema)


def _sources(folder: Path) -> list[Path]:
    """The kept source files (regular files only: links are not followed out of the folder)."""
    if not folder.is_dir() or folder.is_symlink():
        return []
    return sorted(f for f in folder.rglob("*") if f.is_file() and not f.is_symlink())

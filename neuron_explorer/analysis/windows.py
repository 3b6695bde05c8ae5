"""The windows a step's dependency graph is built over (depgraph.py): each rank's ProfilerStep
spans, the whole trace per rank without them, or the instances of a named host span; the events
such a graph reads from the profile; and `Window`, one rank's window in the graph."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from ..errors import ExplorerError
from ..model.profile import Profile
from ..vocab.kinds import FRAMEWORK_KINDS
from .conventions import NEURON_COPY_KIND, NEURON_SYNC_KIND, sql_list
from .steps import StepTime, partial_last_steps

# a queue's gap shorter than this between two kernels is the next launch's latency, not the
# queue running dry (device-idle-gaps' MIN_GAP_NS)
QUEUE_GAP_NS = 50_000


@dataclass
class Window:
    """One rank's step (or other window): its host nodes in program order, and the device
    work they launched, with what each host node waits for."""

    rank: int
    step: int | None
    start_ns: int
    end_ns: int  # the host window's end
    host: list[int] = field(default_factory=list)  # node indices in program order
    launched: dict[int, list[int]] = field(default_factory=dict)  # launch -> device nodes
    orphans: list[int] = field(default_factory=list)  # device work with no launch here
    waits_for: dict[int, str] = field(default_factory=dict)  # host node -> all | collectives | own
    # a stream's wait node -> the work it waits for (cudaStreamWaitEvent)
    stream_waits: dict[int, int] = field(default_factory=dict)
    pending_waits: dict[int, tuple[str, int]] = field(default_factory=dict)  # -> (track, record)
    # the framework spans inside the window, (start, end, event id, name), to name host time
    spans: list[tuple[int, int, int, str, str | None, str | None]] = field(default_factory=list)
    span_starts: list[int] = field(default_factory=list)  # the spans' starts, sorted with them
    # track -> other windows' work on it (starts, and the latest end up to each), fixed
    foreign: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)

    def busy_until(self, track: str, t: int) -> int:
        """Where other windows' work started by `t` leaves the track free."""
        starts, ends = self.foreign.get(track, ((), ()))  # type: ignore[arg-type]
        i = bisect.bisect_right(starts, t)
        return ends[i - 1] if i else -(1 << 62)

    def busy_from(self, track: str, t: int) -> int:
        """Where the run of other windows' work that busy_until(track, t) ends began: that
        work kept the track busy from there, each gap shorter than QUEUE_GAP_NS (t when none
        started by t)."""
        starts, ends = self.foreign.get(track, ((), ()))  # type: ignore[arg-type]
        i = bisect.bisect_right(starts, t) - 1
        if i < 0:
            return t
        while i > 0 and starts[i] - ends[i - 1] < QUEUE_GAP_NS:
            i -= 1
        return starts[i]


# device work that occupies a queue (neuron instructions and DMA transfers are a kernel's parts)
QUEUED_KINDS = ("kernel", "gpu_kernel", "gpu_memcpy", "gpu_memset", "collective", "sync")
_COLUMNS = ("id", "rank", "layer", "kind", "name", "track", "start_ns", "dur_ns", "flow_id",
            "step", "op_name", "module", "src_file", "src_line", "args", "shapes", "dtypes")  # fmt: skip
Win = tuple[int, int | None, int, int]  # rank, step, start_ns, end_ns
LAG_NS = 1_000_000_000  # device work read up to this long after a window (at least)


def windows_of(
    profile: Profile, annotation: str | None = None
) -> list[tuple[int, int | None, int, int]]:
    """(rank, step, start_ns, end_ns) of every step window (ProfilerStep spans; one window per
    rank over the whole trace without them), or of every instance of an annotation."""
    if annotation is not None:
        rows = (
            profile.duckdb()
            .execute(
                "SELECT rank, NULL, start_ns, start_ns + dur_ns FROM events WHERE layer = 'host' "
                "AND kind IN ('annotation', 'op', 'python') AND name = ? ORDER BY rank, start_ns",
                [annotation],
            )
            .fetchall()
        )
        if not rows:
            raise ExplorerError(f"{profile.path}: no host span named {annotation!r}")
        return [(int(r), None, int(s), int(e)) for r, _, s, e in rows]
    if profile.manifest.steps:
        return [(s.rank, s.step, s.start_ns, s.start_ns + s.dur_ns) for s in profile.manifest.steps]
    # a connection only when the manifest has no steps (one costs ~40 ms: each replayed step's
    # graph asks for its windows)
    rows = (
        profile.duckdb()
        .execute(
            "SELECT rank, min(start_ns), max(start_ns + dur_ns) FROM events GROUP BY rank ORDER BY 1"
        )
        .fetchall()
    )
    return [(int(r), None, int(s), int(e)) for r, s, e in rows]


def median_step(wins: list[tuple[int, int | None, int, int]]) -> int | None:
    """The step whose longest rank is the median of the steps (None: no ProfilerStep), whole
    steps only: a last step the profiler stopped inside (steps.py) is left out while others
    remain (of two steps, the whole one, not the 49 us stub a trace ends with)."""
    partial = set(partial_last_steps(StepTime(s, r, a, b - a) for r, s, a, b in wins))
    whole = [w for w in wins if (w[0], w[1]) not in partial] or wins
    by_step: dict[int | None, int] = {}
    for _, s, a, b in whole:
        by_step[s] = max(by_step.get(s, 0), b - a)
    ordered = sorted(by_step.items(), key=lambda kv: (kv[1], -1 if kv[0] is None else kv[0]))
    return ordered[(len(ordered) - 1) // 2][0]


def read_events(profile: Profile, chosen: list) -> list[dict[str, Any]]:
    """The events a graph of these windows needs: host launches, waits and framework spans
    inside them, and the device queues' work of those ranks: the work their launches caused
    (or that started inside them unlaunched), and the other work near them on the same queues
    that the graph's work can wait behind (Window.busy_until).

    One join with the windows (a scan of the events whatever the number of ranks), and of the
    other work near a window only what started by the last start of the window's own work on
    that queue: what starts later is never looked at (busy_until and busy_from look back from
    a node's start), and with LAG_NS it would be every rank's whole trace read for each step.
    Every scan is bounded by the first and last start it can keep (_near_starts): events are
    stored in (rank, start_ns) order, so the row groups' statistics skip the rest (reading
    every column of the 10 GB trace's 1.8 M-event excerpt for each step was 0.6 s of CPU)."""
    if not chosen:
        return []
    con = profile.duckdb()
    ranks = [int(w[0]) for w in chosen]
    steps = [w[1] for w in chosen]
    starts, ends = [int(w[2]) for w in chosen], [int(w[3]) for w in chosen]
    _register_windows(con, ranks, steps, starts, ends)
    host_kinds = ("runtime", NEURON_SYNC_KIND, NEURON_COPY_KIND, *FRAMEWORK_KINDS)
    near_lo, near_hi = _near_starts(con, ranks, steps, starts, ends)
    sql = f"""
    WITH host AS (
        SELECT x.id, x.rank, x.kind, x.flow_id FROM events x SEMI JOIN graph_windows w
            ON x.rank = w.rank AND x.start_ns >= w.s AND x.start_ns < w.e
        WHERE x.layer = 'host' AND x.kind IN {sql_list(host_kinds)}
            AND x.start_ns >= {min(starts)} AND x.start_ns < {max(ends)}),
    near AS MATERIALIZED (
        SELECT x.id, x.rank, x.track, x.start_ns, x.flow_id FROM events x SEMI JOIN graph_windows w
            ON x.rank = w.rank AND (x.step = w.step OR x.start_ns BETWEEN w.lo AND w.hi)
        WHERE x.layer = 'device' AND x.kind IN {sql_list(QUEUED_KINDS)}
            AND x.start_ns BETWEEN {near_lo} AND {near_hi}),
    launched AS (SELECT DISTINCT rank, flow_id FROM host
        WHERE kind = 'runtime' AND flow_id IS NOT NULL),
    own AS (  -- the work that may be the windows' own: launched in them, or unlaunched in them
        SELECT n.rank, n.track, n.start_ns FROM near n SEMI JOIN launched l
            ON l.rank = n.rank AND l.flow_id = n.flow_id
        UNION ALL
        SELECT n.rank, n.track, n.start_ns FROM near n JOIN graph_windows w
            ON w.own AND w.rank = n.rank AND n.start_ns >= w.s AND n.start_ns < w.e
        WHERE n.flow_id IS NULL),
    last AS (SELECT rank, track, max(start_ns) AS t FROM own GROUP BY rank, track),
    kept AS (
        SELECT id FROM host
        UNION ALL
        SELECT n.id FROM near n JOIN last ON last.rank = n.rank
            AND last.track IS NOT DISTINCT FROM n.track AND n.start_ns <= last.t)
    SELECT {", ".join(_COLUMNS)} FROM events SEMI JOIN kept ON events.id = kept.id
    WHERE events.start_ns BETWEEN {min(min(starts), near_lo)} AND {max(max(ends), near_hi)}
    ORDER BY rank, start_ns, id"""
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _register_windows(con: Any, ranks: list[int], steps: list, starts: list[int],
                      ends: list[int]) -> None:  # fmt: skip
    """The windows as DuckDB's graph_windows: each window's span [s, e), the stretch [lo, hi]
    its device work may wait behind (the step's own work may run long after its host span),
    and whether it is its rank's window in the graph (own: the last one, as _assemble keeps)."""
    import pyarrow as pa

    last_of = {r: i for i, r in enumerate(ranks)}
    con.register("graph_windows", pa.table({
        "rank": pa.array(ranks, pa.int64()), "step": pa.array(steps, pa.int64()),
        "s": pa.array(starts, pa.int64()), "e": pa.array(ends, pa.int64()),
        "lo": pa.array([s - (e - s) for s, e in zip(starts, ends, strict=True)], pa.int64()),
        "hi": pa.array([e + max(4 * (e - s), LAG_NS) for s, e in zip(starts, ends, strict=True)],
                       pa.int64()),
        "own": pa.array([last_of[r] == i for i, r in enumerate(ranks)]),
    }))  # fmt: skip


def _near_starts(con: Any, ranks: list[int], steps: list, starts: list[int],
                 ends: list[int]) -> tuple[int, int]:  # fmt: skip
    """The first and last start of any device work read_events may keep: the windows' near
    stretches and their steps' own work (a few integer columns read, the row groups of other
    steps skipped by their statistics), so its join reads only the row groups in between."""
    first = min(s - (e - s) for s, e in zip(starts, ends, strict=True))
    last = max(e + max(4 * (e - s), LAG_NS) for s, e in zip(starts, ends, strict=True))
    own = sorted({int(s) for s in steps if s is not None})
    if own:
        a, b = con.execute(
            f"SELECT min(start_ns), max(start_ns) FROM events WHERE step IN ({_ints(own)}) "
            f"AND rank IN ({_ints(sorted(set(ranks)))}) AND layer = 'device'"
        ).fetchall()[0]
        if a is not None:
            first, last = min(first, int(a)), max(last, int(b))
    return first, last


def _ints(values: list[int]) -> str:
    return ", ".join(str(int(v)) for v in values)

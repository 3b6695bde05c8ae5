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
from .conventions import NEURON_COPY_KIND, NEURON_SYNC_KIND
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
    con = profile.duckdb()
    if annotation is not None:
        rows = con.execute(
            "SELECT rank, NULL, start_ns, start_ns + dur_ns FROM events WHERE layer = 'host' "
            "AND kind IN ('annotation', 'op', 'python') AND name = ? ORDER BY rank, start_ns",
            [annotation],
        ).fetchall()
        if not rows:
            raise ExplorerError(f"{profile.path}: no host span named {annotation!r}")
        return [(int(r), None, int(s), int(e)) for r, _, s, e in rows]
    if profile.manifest.steps:
        return [(s.rank, s.step, s.start_ns, s.start_ns + s.dur_ns) for s in profile.manifest.steps]
    rows = con.execute(
        "SELECT rank, min(start_ns), max(start_ns + dur_ns) FROM events GROUP BY rank ORDER BY 1"
    ).fetchall()
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
    inside them, and the device queues' work of those ranks."""
    con = profile.duckdb()
    spans = " OR ".join(
        f"(rank = {int(r)} AND start_ns >= {int(s)} AND start_ns < {int(e)})"
        for r, _, s, e in chosen
    )
    # device work: the step's own (it may run long after its host span), and what ran near
    # the window on the same queues (earlier steps' work it waits behind)
    near = " OR ".join(
        f"(rank = {int(r)} AND ({'FALSE' if st is None else f'step = {int(st)}'} OR start_ns "
        f"BETWEEN {int(s) - (int(e) - int(s))} AND {int(e) + max(4 * (int(e) - int(s)), LAG_NS)}))"
        for r, st, s, e in chosen
    )
    host_kinds = ("runtime", NEURON_SYNC_KIND, NEURON_COPY_KIND, *FRAMEWORK_KINDS)
    queued = ", ".join(f"'{k}'" for k in QUEUED_KINDS)
    sql = f"""SELECT {", ".join(_COLUMNS)} FROM events
        WHERE (layer = 'host' AND kind IN ({", ".join(f"'{k}'" for k in host_kinds)})
               AND ({spans}))
           OR (layer = 'device' AND kind IN ({queued}) AND ({near}))
        ORDER BY rank, start_ns, id"""
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

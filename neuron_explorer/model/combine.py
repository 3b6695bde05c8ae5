"""One profile for every rank of a torch.distributed job.

Each rank writes its own complete profile as a part, `.NAME.ranks/rank=N` beside the profile
NAME; the job's profile NAME is then written once from the parts, under a file lock, by the rank
whose part completes the job or, when a rank never writes, by the last process of the job
(rank_parts.py). The parts stay until every rank of the job is in; a rank that crashed leaves
the others' profile readable, and the manifest names the missing ranks.

Ids (`id`, `parent_id`, `flow_id`, `stack_id`) are renumbered per rank so they stay unique in the
whole profile, and every rank's times are shifted to the earliest rank's origin (on the
modeled clock of a capture: real time minus the simulator's own time, see `_base`). Ranks on one
host share its clock (time.time_ns), so nothing more is needed there. A rank on another host
than the first rank's is aligned on the collectives: the same collective ends at one instant on
every rank, so the median difference of their ends (matched in issue order) is that host's clock
offset; the manifest's `clock_offsets_ns` records what was applied per rank. (Live capture
across hosts still measures each collective's wait with each host's own clock: docs/fleet.md.)
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .io import ProfileWriter
from .manifest import Step
from .profile import Profile


def parts_dir(profile: Path) -> Path:
    return profile.parent / f".{profile.name}.ranks"


def part_path(profile: Path, rank: int) -> Path:
    """Where rank `rank` writes its own part of the job's profile `profile`."""
    return parts_dir(profile) / f"rank={rank}"


def assemble(profile: Path, world_size: int, run_id: str) -> Path:
    """Write `profile` from every rank part present (under a lock); drop the parts when all
    `world_size` ranks are in. (Ranks of a live job go through rank_parts.part_landed, which
    calls this once a job rather than once a rank.)"""
    parts = parts_dir(profile)
    with open(parts / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        present = present_ranks(parts)
        write_job(profile, present, world_size, run_id)
        if len(present) == world_size:
            shutil.rmtree(parts, ignore_errors=True)
    return profile


def present_ranks(parts: Path) -> list[int]:
    """The ranks whose parts are complete in the parts folder `parts`, in order."""
    return sorted(
        int(p.name.split("=", 1)[1])
        for p in parts.glob("rank=*")
        if (p / "manifest.json").is_file()
    )


def write_job(profile: Path, ranks: Sequence[int], world_size: int, run_id: str) -> None:
    """Write the job's profile `profile` from the parts of `ranks` (the caller holds the lock)."""
    profiles = [Profile.open(part_path(profile, r)) for r in ranks]
    _write(profile, profiles, ranks, world_size, run_id)


def _write(
    out: Path, profiles: Sequence[Profile], ranks: Sequence[int], world: int, run_id: str
) -> None:
    offsets = clock_offsets(profiles)
    origin = min(_base(p) + o for p, o in zip(profiles, offsets, strict=True))
    events, stacks, counters, steps = [], [], [], []
    next_id = next_flow = next_stack = 0
    for rank, p, offset in zip(ranks, profiles, offsets, strict=True):
        shift = _base(p) + offset - origin
        ev = p.table("events")
        ev = _set(ev, "rank", pa.array(np.full(ev.num_rows, rank, dtype=np.int32)))
        ev = _set(ev, "start_ns", pc.add(ev.column("start_ns"), shift))
        ev = _set(ev, "id", pc.add(ev.column("id"), next_id))
        ev = _set(ev, "parent_id", pc.add(ev.column("parent_id"), next_id))
        ev = _set(ev, "flow_id", pc.add(ev.column("flow_id"), next_flow))
        st = p.table("stacks")
        ev = _set(ev, "stack_id", pc.add(ev.column("stack_id"), next_stack))
        st = _set(st, "stack_id", pc.add(st.column("stack_id"), next_stack))
        events.append(ev)
        stacks.append(st)
        ct = p.table("counters")
        ct = _set(ct, "rank", pa.array(np.full(ct.num_rows, rank, dtype=np.int32)))
        counters.append(_set(ct, "ts_ns", pc.add(ct.column("ts_ns"), shift)))
        steps += [Step(s.step, rank, s.start_ns + shift, s.dur_ns) for s in p.manifest.steps]
        # the shifted columns' spans: where the next rank's numbers start
        next_id, next_flow = _span(ev, "id"), max(next_flow, _span(ev, "flow_id"))
        next_stack = max(next_stack, _span(st, "stack_id"))
    first = profiles[0].manifest
    extra: dict[str, Any] = {
        **first.extra,
        "world_size": world,
        "run_id": run_id,
        "hosts": {str(r): p.manifest.host for r, p in zip(ranks, profiles, strict=True)},
        "missing_ranks": sorted(set(range(world)) - set(ranks)),
        "clock_offsets_ns": {str(r): o for r, o in zip(ranks, offsets, strict=True)},
    }
    extra.pop("run_ended", None)  # the first rank's: the job's is chosen below
    ended = {
        str(r): {**p.manifest.extra["run_ended"], "rank": r}
        for r, p in zip(ranks, profiles, strict=True)
        if p.manifest.extra.get("run_ended")
    }
    if ended:
        extra["ranks_ended"] = ended
        extra["run_ended"] = first_failure(list(ended.values()))
    # each rank's host costs, as its own process measured them (device_spec is the first's)
    host_costs = {
        str(r): _host_costs(p.manifest.device_spec) for r, p in zip(ranks, profiles, strict=True)
    }
    if any(host_costs.values()):
        extra["host_costs_ns"] = host_costs
    # each rank's run-queue delay cut from its host clock (the first rank's is no job's figure)
    queued = {str(r): p.manifest.extra["run_queue"] for r, p in zip(ranks, profiles, strict=True)
              if "run_queue" in p.manifest.extra}  # fmt: skip
    extra.pop("run_queue", None)
    if queued:
        extra["run_queue_by_rank"] = queued
    with ProfileWriter(out, overwrite=True) as writer:
        writer.write_events(_concat(events).sort_by([("rank", "ascending"),
                                                     ("start_ns", "ascending"),
                                                     ("id", "ascending")]))  # fmt: skip
        writer.write_table("stacks", _concat(stacks))
        writer.write_table("counters", _concat(counters))
        graphs = _graphs(profiles)
        if graphs is not None:
            writer.write_table("graphs", graphs)
        for p in profiles:
            for name, text in _sources(p):
                writer.add_source(name, text)
        writer.commit(
            replace(
                first,
                origin_unix_ns=origin,
                ranks=tuple(ranks),
                steps=tuple(sorted(steps, key=lambda s: (s.rank, s.step, s.start_ns))),
                extra=extra,
            )
        )


def first_failure(ended: list[dict[str, Any]]) -> dict[str, Any]:
    """The exception that ended the job: the earliest to end its rank. The others' are what it
    caused (gloo's "Connection closed by peer" when a peer's process is gone). A rank's
    exception ends its process only after its part is written, so the peers fail later."""
    return min(ended, key=lambda e: (e.get("unix_ns") is None, e.get("unix_ns") or 0))


def clock_offsets(profiles: Sequence[Profile]) -> list[int]:
    """ns to add to each profile's clock to put it on the first profile's host clock."""
    first = profiles[0]
    ref = _collective_ends(first)
    out = []
    for p in profiles:
        if p is first or p.manifest.host == first.manifest.host:
            out.append(0)
            continue
        ends = _collective_ends(p)
        n = min(len(ref), len(ends))
        out.append(int(np.median(ref[:n] - ends[:n])) if n else 0)
    return out


def _collective_ends(p: Profile) -> np.ndarray:
    """Unix-ns ends of a profile's device collectives, in the order they ran."""
    ev = p.table("events", ["kind", "layer", "start_ns", "dur_ns"])
    mask = pc.and_(
        pc.equal(ev.column("kind"), "collective"), pc.equal(ev.column("layer"), "device")
    )
    ev = ev.filter(mask).sort_by("start_ns")
    ends = ev.column("start_ns").to_numpy() + ev.column("dur_ns").to_numpy()
    return ends.astype(np.int64) + _base(p)


def _base(p: Profile) -> int:
    """Unix ns of a part's time 0 on its process's modeled clock. A capture's timeline starts
    with the simulator time cut before its window taken out (the manifest's
    `simulator_ns_before`); the clock the ranks share is real time minus all of it."""
    return p.manifest.origin_unix_ns - int(p.manifest.extra.get("simulator_ns_before", 0))


def _set(table: pa.Table, name: str, values: Any) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), values.cast(table.schema.field(i).type))


def _host_costs(spec: dict[str, Any] | None) -> dict[str, int]:
    """The per-op host costs a capture's spec was modeled with (runtime/hostcal.py), if any."""
    runtime = (spec or {}).get("runtime") or {}
    return {k: runtime[k] for k in ("launch_ns", "metadata_ns", "free_ns") if k in runtime}


def _span(table: pa.Table, name: str) -> int:
    """One more than the largest id of the column (0 for an empty or all-null one)."""
    top = pc.max(table.column(name)).as_py() if table.num_rows else None
    return int(top) + 1 if top is not None else 0


def _concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive").unify_dictionaries()


def _graphs(profiles: Sequence[Profile]) -> pa.Table | None:
    """The ranks' compiled graphs, each once: a key names one graph's content (a hash), so the
    ranks that lowered the same graph kept the same rows."""
    kept: list[pa.Table] = []
    seen: set[str] = set()
    for p in profiles:
        t = p.optional_table("graphs")
        if t is None or not t.num_rows:
            continue
        new = pc.invert(
            pc.is_in(
                t.column("graph").cast(pa.string()), value_set=pa.array(sorted(seen), pa.string())
            )
        )
        kept.append(t.filter(new))
        seen.update(t.column("graph").cast(pa.string()).to_pylist())
    return _concat(kept) if kept else None


def _sources(p: Profile) -> list[tuple[str, str]]:
    """The source snapshots of one rank's part."""
    root = p.path / "sources"
    out = []
    for path in sorted(root.rglob("*")) if root.is_dir() else ():
        if path.is_file() and not path.is_symlink():
            out.append(
                (os.path.relpath(path, root), path.read_text(encoding="utf-8", errors="replace"))
            )
    return out


class _RankView(Profile):
    """One rank of a job's profile, read in place: events and counters filtered to the rank,
    the manifest naming only it (rank_view)."""

    def __init__(self, job: Profile, rank: int) -> None:
        m = job.manifest
        steps = tuple(s for s in m.steps if s.rank == rank)
        super().__init__(job.path, replace(m, ranks=(rank,), steps=steps, row_counts={}))
        self._job, self._rank = job, rank

    @property
    def name(self) -> str:
        return f"{self._job.name}@rank={self._rank}"

    @property
    def _datasets(self) -> dict[str, Any]:  # type: ignore[override]
        mine = pc.field("rank") == self._rank
        return {
            name: d.filter(mine) if name in ("events", "counters") else d
            for name, d in self._job._datasets.items()
        }


def rank_view(job: Profile, rank: int) -> Profile:
    """Rank `rank` of a profile of several ranks as a profile of its own (nothing is copied);
    a BadInputError naming the profile if it holds no such rank."""
    from ..errors import BadInputError

    if rank not in job.manifest.ranks:
        raise BadInputError(job.path, f"no rank {rank} (ranks {list(job.manifest.ranks)})")
    return _RankView(job, rank)

"""When a job's profile is assembled from its ranks' parts: once, not once a rank.

Each rank writes its part (combine.part_path) and then calls `part_landed`. The job's profile is
written by the rank whose part completes the job (every part present: the parts are then
removed), or, when a rank will never write (it crashed, was killed, or never profiles), by the
last process of the job still present, from the parts there, its missing ranks named. A
process is present while it holds an exclusive lock on its own file in the parts folder
(`attend`): the kernel drops the lock when the process ends, however it ends, so the others
see it gone. That check is made where a part lands, when a present rank's process exits, and by
`neuron-explorer capture` once torchrun has ended (`settle`). A set of parts is assembled at most
once (`.assembled` names the last set written), so a job of N ranks is written once, not N
times from ever more parts (the cost grew with the square of the ranks). The ranks write their
parts a few at a time (`writing`): each holds its step's events until its part is written, and
what merging them adds would otherwise be held by every rank of the job at once.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from . import combine

_held: dict[tuple[Path, int], IO[str]] = {}  # this process's presence locks, kept to its exit


def attend(profile: Path, rank: int) -> None:
    """Mark this process present as rank `rank` of the job writing `profile`, until it exits;
    at its exit the job's profile is assembled if it is then the last process present."""
    key = (Path(profile), rank)
    if key in _held:
        return
    folder = combine.parts_dir(key[0]) / ".present"
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / f"rank={rank}", "a")  # held until the process exits
    fcntl.flock(handle, fcntl.LOCK_EX)
    if not _held:
        atexit.register(_settle_at_exit)
    _held[key] = handle


@contextmanager
def writing(profile: Path, rank: int) -> Iterator[None]:
    """Rank `rank` writes its part of `profile` inside this block, at most as many ranks at
    once as this process may use CPUs: merging a part is CPU-bound, so more at once would not
    end sooner, and each writer adds what merging its events holds (a 32-layer Llama-3-8B
    rank's 0.1 GiB) to the job's memory. A writer that ends, however it ends, frees its slot."""
    slots = max(len(os.sched_getaffinity(0)), 1) if hasattr(os, "sched_getaffinity") else 1
    folder = combine.parts_dir(Path(profile)) / ".writers"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"slot={rank % slots}", "a") as slot:
        fcntl.flock(slot, fcntl.LOCK_EX)  # released when closed
        yield


def part_landed(profile: Path, world_size: int, run_id: str, rank: int) -> bool:
    """Rank `rank`'s part of `profile` is written: assemble the job's profile if this part
    completes it, or if no other process of the job is present. True when it was written."""
    parts = combine.parts_dir(profile)
    with _locked(parts) as present:
        if present is None or rank not in present:
            return False  # the rank that completed the job wrote it (with this part) and left
        (parts / ".job").write_text(json.dumps({"world_size": world_size, "run_id": run_id}))
        if len(present) == world_size or not _others_present(parts, rank):
            return _assemble(profile, present, world_size, run_id)
    return False


def settle(profile: Path, rank: int | None = None) -> bool:
    """Assemble `profile` from the parts present if no process of the job but this one (rank
    `rank`, or none: the command that launched the job) is present, and that set of parts was
    not assembled yet. True when it was written."""
    parts = combine.parts_dir(profile)
    with _locked(parts) as present:
        if not present or _others_present(parts, rank) or not (parts / ".job").is_file():
            return False
        job = json.loads((parts / ".job").read_text())
        if _assembled(parts) == present:
            return False
        return _assemble(profile, present, int(job["world_size"]), str(job["run_id"]))


def _assemble(profile: Path, present: list[int], world_size: int, run_id: str) -> bool:
    parts = combine.parts_dir(profile)
    combine.write_job(profile, present, world_size, run_id)
    if len(present) == world_size:
        shutil.rmtree(parts, ignore_errors=True)  # the lock file with it, still held
    else:
        (parts / ".assembled").write_text(json.dumps(present))
    return True


@contextmanager
def _locked(parts: Path) -> Iterator[list[int] | None]:
    """The ranks whose parts are present, under the parts folder's lock; None when the folder
    is gone (the whole job was written and its parts removed)."""
    try:
        lock = open(parts / ".lock", "a")  # closed below
    except FileNotFoundError:
        yield None
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield combine.present_ranks(parts) if parts.is_dir() else None


def _others_present(parts: Path, rank: int | None) -> bool:
    """True if a process of the job other than rank `rank`'s still holds its presence lock."""
    for path in (parts / ".present").glob("rank=*"):
        if rank is not None and path.name == f"rank={rank}":
            continue
        with open(path, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
    return False


def _assembled(parts: Path) -> list[int] | None:
    try:
        return [int(r) for r in json.loads((parts / ".assembled").read_text())]
    except (FileNotFoundError, ValueError):
        return None


def _settle_at_exit() -> None:
    for profile, rank in list(_held):
        try:
            settle(profile, rank)
        except Exception as e:  # noqa: BLE001 - a process's exit must not fail on it
            print(f"neuron-explorer: profile {profile} not assembled: {e}", file=sys.stderr)

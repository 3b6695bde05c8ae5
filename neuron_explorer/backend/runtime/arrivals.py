"""The ranks' arrivals at each collective, on the one modeled clock, swapped through the store of
the group's neuron backend: each rank numbers a group's collectives in issue order (the same on
every rank), publishes its modeled arrival under that number, and reads the others' to find the
last arrival (runtime/collectives.py). A point-to-point receive reads its sender's arrival only.
Keys go once every rank of the group is past them (`_clean`)."""

from __future__ import annotations

import itertools
from typing import Any

from neuron_explorer.backend import model_ranks, pipeline_ranks

_seq: dict[str, itertools.count] = {}  # group name -> collectives recorded on it
_SEND = ("c10d::send",)
_RECV = ("c10d::recv_",)


def peer(args: tuple) -> int:
    """The group rank a c10d::send / recv_ talks to (its third argument), -1 if unknown."""
    return int(args[2]) if len(args) > 2 and isinstance(args[2], int) else -1


_p2p_seq: dict[tuple[str, int, int], itertools.count] = {}  # (group, src, dst) -> messages


def p2p_arrival(op: str, group: Any, args: tuple, mine: int) -> int:
    """A send publishes its modeled arrival under (src, dst, n); a receive reads its sender's
    (the data cannot arrive before it was sent) and returns it; else `mine`."""
    other = peer(args)
    if other < 0 or group is None or op not in _SEND + _RECV:
        return mine
    store = group_store(group)
    if store is None:  # a modeled job: a pipeline's gradient comes when its copy sends it
        sent = pipeline_ranks.sender(other) if op in _RECV and model_ranks.world_size() else None
        return mine if sent is None else sent
    me = group.rank()
    src, dst = (me, other) if op in _SEND else (other, me)
    n = next(_p2p_seq.setdefault((group.group_name, src, dst), itertools.count()))
    key = f"neuron-p2p/{src}/{dst}/{n}"
    if op in _SEND:
        store.set(key, str(mine))
        return mine
    sent = int(store.get(key))  # blocks until the sender issued it, as the data would
    store.delete_key(key)
    return sent


def number(group: Any) -> int:
    """This collective's number in its group: the same on every rank (they issue a group's
    collectives in one order), profiled or not."""
    name = group.group_name if group is not None else ""
    return next(_seq.setdefault(name, itertools.count()))


def announce(group: Any, seq: int, mine: int) -> Any:
    """Publish this rank's modeled arrival at collective `seq`; the group's store, or None."""
    if group is None or group.size() <= 1:
        return None
    store = group_store(group)
    if store is None:
        return None
    rank = group.rank()
    store.set(f"neuron-clock/{seq}/{rank}", str(mine))
    if seq and seq % _CLEAN_EVERY == 0:
        _clean(store, group, rank, seq)
    return store


_CLEAN_EVERY = 64  # collectives of a group between two clean-ups of this rank's arrival keys
_cleaned: dict[str, int] = {}  # group name -> this rank's keys below this number are deleted


def _clean(store: Any, group: Any, rank: int, seq: int) -> None:
    """Delete this rank's arrival keys of the collectives every rank of `group` is past. Not
    sooner: a broadcast's root (a send, a scatter's root, a reduce's leaf) finishes its part
    without waiting for the others, so it can be collectives ahead of a rank that has yet to
    read its key (deleting at seq - 2, as this once did, hung ZeroRedundancyOptimizer's
    parameter broadcasts now and then). Each rank posts how far it is; the slowest bounds what
    goes."""
    store.set(f"neuron-done/{rank}", str(seq))  # it has read every collective before seq
    keys = [f"neuron-done/{r}" for r in range(group.size())]
    if not store.check(keys):
        return
    low = min(int(v) for v in store.multi_get(keys))
    name = group.group_name
    for old in range(_cleaned.get(name, 0), low):
        store.delete_key(f"neuron-clock/{old}/{rank}")
    _cleaned[name] = max(_cleaned.get(name, 0), low)


def last_arrival(group: Any, mine: int, seq: int) -> int:
    """The latest modeled arrival of any rank of `group` at its collective number `seq`."""
    store = announce(group, seq, mine)
    if store is None:
        return mine
    keys = [f"neuron-clock/{seq}/{r}" for r in range(group.size())]
    return max(int(v) for v in store.multi_get(keys))


# group name -> the store its neuron backend was created with (backend/distributed.py fills it)
stores: dict[str, Any] = {}


def group_store(group: Any) -> Any:
    """The store the neuron backend of `group` was created with (None for other backends)."""
    return stores.get(group.group_name)

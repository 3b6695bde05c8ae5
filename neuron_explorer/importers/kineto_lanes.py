"""The lanes (the events table's `track`) and devices of a Kineto trace's rows.

A lane is one (pid, tid) pair on one layer. It is named as the trace names it, by its last
`thread_name` metadata event (what Perfetto and chrome://tracing show: "stream 7",
"Stream 108", "thread 1102 (pt_main_thread)"); without one, `thread <tid>` on the host and
`stream <tid>` on the device, a tid that already reads "stream 7" or "thread 3" kept as it is.
A tid written once as a number and once as text (25738 and "25738", as old traces do) is one
thread. `process_name` metadata names the processes in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .kineto_extract import Decoded
from .kineto_frames import compact

LANE_WORDS = ("thread", "stream")  # a tid starting so is a lane name already


@dataclass(frozen=True)
class Lanes:
    """Per row its lane's code (host nesting goes by it) and per code the lane's name."""

    code: np.ndarray
    names: pa.Array
    keys: np.ndarray  # per code, sorted: its (pid, tid, layer) key

    def host_lane_of(self, d: Decoded, events: np.ndarray) -> np.ndarray:
        """The host lane code of each of `events` (any event: flow points too), -1 where no
        row is on its thread."""
        key = _key(d, events, np.zeros(events.size, dtype=bool))
        pos = np.clip(np.searchsorted(self.keys, key), 0, max(self.keys.size - 1, 0))
        found = self.keys.size > 0 and self.keys[pos] == key
        return np.where(found, pos, -1)


def _key(d: Decoded, events: np.ndarray, dev: np.ndarray) -> np.ndarray:
    """Per event its (pid, tid, layer) key, made in place in one int64 column (a column the
    size of the rows each step would otherwise be: the mapping's peak, measured)."""
    _, pid_of = _texts(d.pids, d.pid_code[events])
    tids, tid_of = _texts(d.tids, d.tid_code[events])
    space = 2 * (int(pid_of.max(initial=0)) + 1) * len(tids)
    key: np.ndarray[Any, np.dtype[np.signedinteger[Any]]] = pid_of.astype(
        np.int32 if space < 2**31 else np.int64  # int32: a few lanes
    )
    del pid_of
    key *= len(tids)
    key += tid_of
    key *= 2
    key += dev
    return key


@dataclass(frozen=True)
class Metadata:
    """The lane-naming metadata events: (pid text, tid text) -> thread name, pid -> process
    name (the last event of each wins, as in trace viewers)."""

    threads: dict[tuple[str, str], str]
    processes: dict[str, str]


def _texts(values: pa.Array, codes: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct texts of `values` and, per code of `codes` (the events asked about: never
    every event's, a column the size of the trace), the code of its value's text (values
    equal as text share a code; a null value reads as "")."""
    texts = np.array([*values.to_pylist(), ""], dtype=object)
    distinct, inverse = np.unique(texts.astype(str), return_inverse=True)
    inverse = inverse.reshape(-1).astype(np.int32)  # a few distinct pids or tids
    return distinct.tolist(), inverse[codes]  # code -1 takes the appended ""


def metadata(d: Decoded, events: np.ndarray) -> Metadata:
    """The names given by the metadata events at `events` (their decoded `lane` args)."""
    (given,) = d.typed["lane"]
    threads: dict[tuple[str, str], str] = {}
    processes: dict[str, str] = {}
    pid_text, tid_text = d.pids.to_pylist(), d.tids.to_pylist()
    for i, name in zip(events.tolist(), given.to_pylist(), strict=True):
        if not name or not name.strip():
            continue
        pid = pid_text[d.pid_code[i]] if d.pid_code[i] >= 0 else ""
        if d.name_list[d.name_code[i]] == "process_name":
            processes[pid] = name.strip()
        else:
            tid = tid_text[d.tid_code[i]] if d.tid_code[i] >= 0 else ""
            threads[(pid, tid)] = name.strip()
    return Metadata(threads, processes)


def lanes(d: Decoded, rows: np.ndarray, dev: np.ndarray, meta: Metadata | None) -> Lanes:
    """The lanes of `rows` (`dev`: on the device layer), named by `meta` where it names them
    (None: by tid only)."""
    pids, _ = _texts(d.pids, d.pid_code[:0])
    tids, _ = _texts(d.tids, d.tid_code[:0])
    distinct, code = _factorize(_key(d, rows, dev), 2 * len(pids) * len(tids))
    names = []
    for k in distinct.tolist():
        pid, tid, on_device = pids[k // 2 // len(tids)], tids[k // 2 % len(tids)], k % 2
        given = meta.threads.get((pid, tid)) if meta else None
        names.append(given or _default_name(tid, bool(on_device)))
    code = compact(code.reshape(-1))
    return Lanes(code, pa.array(names, pa.string()), distinct)


DENSE_KEYS = 1 << 22  # below this many possible keys, a table beats sorting the rows


def _factorize(key: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys (sorted) and each key's index among them: by a table over the key
    space when it is small (linear in the rows: no sort of millions of rows for a few lanes)."""
    if space > DENSE_KEYS:
        distinct, code = np.unique(key, return_inverse=True)
        return distinct, code.reshape(-1)
    present = np.zeros(space, dtype=bool)
    present[key] = True
    distinct = np.flatnonzero(present)
    index = (np.cumsum(present) - 1).astype(np.int32)  # fewer keys than DENSE_KEYS
    return distinct, index[key]


def _default_name(tid: str, on_device: bool) -> str:
    if tid.lower().startswith(LANE_WORDS):
        return tid
    return f"{'stream' if on_device else 'thread'} {tid}"


def devices(
    d: Decoded, rows: np.ndarray, dev: np.ndarray, mtia: np.ndarray
) -> tuple[np.ndarray, pa.Array]:
    """Per row a code into the device names: cpu for the host, cuda:<pid> for device work
    (ROCm too, as torch names it), mtia:<pid> for MTIA device work."""
    pids, code = _texts(d.pids, d.pid_code[rows])
    code += 1
    code[mtia[rows]] += len(pids)
    code[~dev] = 0
    names: list[Any] = ["cpu", *(f"cuda:{p}" for p in pids), *(f"mtia:{p}" for p in pids)]
    return code, pa.array(names, pa.string())

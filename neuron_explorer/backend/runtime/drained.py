"""What `events.drain()` returns: the runtime's events, each kernel's instruction and DMA events
kept as rows of its plan's columns and built only while they are read.

A real-size step drains 200,000 instruction and DMA events (the default instruction limit). As
one `RuntimeEvent` each they held about 160 MiB of a shapes-only rank from the drain until its
profile was written; as rows they hold 8 bytes each (their event ids), and each reading builds
them anew, equal field for field. Readers that want only the whole events (host calls, kernels,
memory) take `whole()`, which builds none.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any

from neuron_explorer.vocab.engines import DMA_ENGINE as DMA
from neuron_explorer.vocab.engines import DMA_PREFIX


class InstrRows:
    """One kernel's instruction and DMA events: its first `len(ids)` instructions, placed at
    `shift + offsets`, their DMA queues rotated by `rot` of `nq`; `kernel` is its event."""

    __slots__ = ("kernel", "plan", "offsets", "rot", "nq", "shift", "base", "ids")

    def __init__(self, kernel: Any, plan: Any, run: Any, base: int, ids: array) -> None:
        self.kernel, self.plan, self.base, self.ids = kernel, plan, base, ids
        self.offsets, self.shift = run.offsets, run.shift
        self.rot, self.nq = run.queue_offset, run.dma_queues

    def __len__(self) -> int:
        return len(self.ids)

    def events(self) -> Iterator[Any]:
        k = self.kernel
        make = type(k)  # RuntimeEvent (events.py), without importing it back
        base, shift, rot, nq = self.base, self.shift, self.rot, self.nq
        tracks = _dma_tracks(nq)
        op, tid, flow, pid, stack, module = k.op_name, k.tid, k.flow_id, k.id, k.stack, k.module
        file, line, func, seq, bwd = k.src_file, k.src_line, k.src_func, k.seq_nr, k.is_backward
        instrs = islice(self.plan.instrs, len(self.ids))
        for eid, ins, at in zip(self.ids, instrs, self.offsets, strict=False):
            engine = ins.engine
            track = tracks[(ins.queue + rot) % nq] if engine == DMA else engine
            yield make(
                id=eid, kind="dma" if track.startswith("DMA") else "instruction",
                name=ins.opcode, op_name=op, tid=tid, device_start_ns=base + int(shift + at),
                device_dur_ns=int(ins.dur_ns), track=track, engine=engine,
                flops=int(ins.flops), bytes_read=int(ins.bytes_read),
                bytes_written=int(ins.bytes_written), flow_id=flow, parent_id=pid,
                src_file=file, src_line=line, src_func=func, stack=stack, module=module,
                seq_nr=seq, is_backward=bwd, args=_instr_args(ins.repeat, ins.utilization),
            )  # fmt: skip


class Drained(Sequence[Any]):
    """Drained events in order: whole events and `InstrRows`, expanded as they are read."""

    __slots__ = ("_items", "_listed")

    def __init__(self, items: list[Any]) -> None:
        self._items = items
        self._listed: list[Any] | None = None  # built once where an event is read by index

    @property
    def items(self) -> list[Any]:
        return self._items

    def __len__(self) -> int:
        return sum(len(x) if type(x) is InstrRows else 1 for x in self._items)

    def __iter__(self) -> Iterator[Any]:
        for x in self._items:
            if type(x) is InstrRows:
                yield from x.events()
            else:
                yield x

    def __getitem__(self, i: Any) -> Any:
        if self._listed is None:
            self._listed = list(self)
        return self._listed[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, Drained)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a list's equality, a list's hash

    def __repr__(self) -> str:
        return f"Drained({len(self)} events)"

    def clear(self) -> None:
        self._items.clear()
        self._listed = None

    def whole(self) -> list[Any]:
        """The events other than kernels' instructions and DMA transfers, built already."""
        return [x for x in self._items if type(x) is not InstrRows]

    def select(self, keep: Callable[[Any], bool]) -> Drained:
        """The events `keep` accepts, in order; a kernel's rows stay rows where it accepts
        them all."""
        out: list[Any] = []
        for x in self._items:
            if type(x) is not InstrRows:
                if keep(x):
                    out.append(x)
                continue
            kept = [e for e in x.events() if keep(e)]
            if len(kept) == len(x):
                out.append(x)
            else:
                out.extend(kept)
        return Drained(out)

    def sorted_by_id(self) -> Drained:
        """The events by id: each kernel's rows, whose ids run in order, as one block where
        no other event's id falls among theirs (else built, and sorted one by one)."""
        items = sorted(self._items, key=_first_id)
        last = 0
        for x in items:  # a block's ids ascend: they were taken from the counter together
            if _first_id(x) < last:
                return Drained(sorted(self, key=lambda e: e.id))
            last = x.ids[-1] if type(x) is InstrRows else x.id
        return Drained(items)


def whole(events: Sequence[Any]) -> Sequence[Any]:
    """`events` without kernels' instruction and DMA rows where they are `Drained`."""
    return events.whole() if isinstance(events, Drained) else events


def _first_id(x: Any) -> int:
    return x.ids[0] if type(x) is InstrRows else x.id


_args_of: dict[tuple, dict] = {}
_tracks: dict[int, list[str]] = {}


def _dma_tracks(nq: int) -> list[str]:
    """The lane names of `nq` DMA queues, made once."""
    got = _tracks.get(nq)
    if got is None:
        got = _tracks[nq] = [f"{DMA_PREFIX}{q}" for q in range(nq)]
    return got


def _instr_args(count: int, utilization: float) -> dict:
    """An instruction event's args, one dict for each (count, utilization): read-only, shared
    by the events that carry it."""
    key = (count, utilization, type(count), type(utilization))  # 1 and 1.0 are one key
    args = _args_of.get(key)
    if args is None:
        if len(_args_of) > 1 << 16:
            _args_of.clear()
        args = _args_of[key] = {"count": count, "utilization": utilization}
    return args

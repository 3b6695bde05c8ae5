"""The device clock: engines and DMA queues as in-order queues running kernels' instructions."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .plan import DMA, ENGINES, KernelPlan
from .spec import DeviceSpec, get_spec


@dataclass(frozen=True)
class InstrRun:
    """One instruction (or batch of `count`) placed on the device clock, in ns."""

    track: str
    engine: str
    opcode: str
    start_ns: int
    dur_ns: int
    flops: int
    bytes_read: int
    bytes_written: int
    count: int = 1
    utilization: float = 1.0

    @property
    def wasted_share(self) -> float:
        """Share of the engine's capacity this instruction leaves unused (TensorE: padding)."""
        return 1.0 - self.utilization


@dataclass(frozen=True)
class KernelRun:
    """A kernel placed on the device clock; `instrs` are built on first access."""

    plan: KernelPlan
    start_ns: int
    end_ns: int
    starts: tuple[int, ...] = field(default=(), repr=False)
    queue_offset: int = field(default=0, repr=False)
    dma_queues: int = field(default=16, repr=False)

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns

    @cached_property
    def instrs(self) -> list[InstrRun]:
        nq, off = self.dma_queues, self.queue_offset
        out = []
        for ins, start in zip(self.plan.instrs, self.starts, strict=True):
            track = f"DMA q{(ins.queue + off) % nq}" if ins.engine == DMA else ins.engine
            out.append(InstrRun(track, ins.engine, ins.opcode, start, ins.dur_ns, ins.flops,
                                ins.bytes_read, ins.bytes_written, ins.repeat, ins.utilization))  # fmt: skip
        return out

    def busy_ns(self) -> dict[str, int]:
        """Time each track of this kernel spends executing its instructions."""
        busy: dict[str, int] = {}
        for r in self.instrs:
            busy[r.track] = busy.get(r.track, 0) + r.dur_ns
        return busy


class DeviceTimeline:
    """Schedules kernels on one NeuronCore: each engine and DMA queue runs its instructions in
    issue order, each instruction starting once its queue is free and its dependencies are done.
    """

    def __init__(self, spec: DeviceSpec | None = None) -> None:
        self.spec = spec or get_spec()
        self._nq = self.spec.dma_queues
        self._free = [0] * (len(ENGINES) + self._nq)
        self._rotation = 0  # successive kernels start on different DMA queues

    def submit(self, plan: KernelPlan, ready_ns: int = 0) -> KernelRun:
        """Place `plan` on the device, no instruction starting before `ready_ns`."""
        ready = int(ready_ns)
        if not plan.sched:
            return KernelRun(plan, ready, ready, (), 0, self._nq)
        free, nq, rot = self._free, self._nq, self._rotation
        base = len(ENGINES)
        starts: list[int] = []
        ends: list[int] = []
        for res, is_dma, dur, deps in plan.sched:
            if is_dma:
                res = base + (res + rot) % nq
            t = free[res]
            if t < ready:
                t = ready
            for d in deps:
                if ends[d] > t:
                    t = ends[d]
            starts.append(t)
            t += dur
            ends.append(t)
            free[res] = t
        self._rotation = (rot + plan.dma_queues_used) % nq
        return KernelRun(plan, min(starts), max(ends), tuple(starts), rot, nq)

    def drain_ns(self) -> int:
        """When every engine and DMA queue is idle (what a sync waits for)."""
        return max(self._free)

    def free_ns(self, track: str) -> int:
        """When `track` ("TensorE", ..., "DMA q3") finishes the work queued on it."""
        if track.startswith("DMA q"):
            return self._free[len(ENGINES) + int(track[5:])]
        return self._free[ENGINES.index(track)]

    def reset(self) -> None:
        self._free = [0] * len(self._free)
        self._rotation = 0

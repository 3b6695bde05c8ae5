"""The device clock: engines and DMA queues as in-order queues running kernels' instructions."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from neuron_explorer.vocab.engines import DMA_PREFIX, dma_queue

from .plan import DMA, ENGINE_INDEX, KernelPlan
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
    offsets: tuple[int, ...] = field(default=(), repr=False)  # instruction starts - shift
    queue_offset: int = field(default=0, repr=False)
    dma_queues: int = field(default=16, repr=False)
    shift: int = field(default=0, repr=False)

    @property
    def starts(self) -> tuple[int, ...]:
        """Each instruction's start on the device clock."""
        shift = self.shift
        return tuple([shift + s for s in self.offsets])

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns

    @cached_property
    def instrs(self) -> list[InstrRun]:
        nq, off, shift = self.dma_queues, self.queue_offset, self.shift
        out = []
        for ins, start in zip(self.plan.instrs, self.offsets, strict=True):
            track = f"{DMA_PREFIX}{(ins.queue + off) % nq}" if ins.engine == DMA else ins.engine
            out.append(InstrRun(track, ins.engine, ins.opcode, shift + start, ins.dur_ns, ins.flops,
                                ins.bytes_read, ins.bytes_written, ins.repeat, ins.utilization))  # fmt: skip
        return out

    def busy_ns(self) -> dict[str, int]:
        """Time each track of this kernel spends executing its instructions."""
        busy: dict[str, int] = {}
        for r in self.instrs:
            busy[r.track] = busy.get(r.track, 0) + r.dur_ns
        return busy


class DeviceTimeline:
    """Schedules kernels on one NeuronCore. Kernels run one at a time in launch order, as the
    Neuron runtime executes one NEFF at a time on a core: a kernel starts once it is launched
    and the previous one has ended, so its duration is its own schedule whatever the host's
    speed. Inside a kernel each engine and DMA queue runs its instructions in issue order, each
    starting once its queue is free and its dependencies are done.
    """

    def __init__(self, spec: DeviceSpec | None = None) -> None:
        self.spec = spec or get_spec()
        self._nq = self.spec.dma_queues
        self._free = [0] * (len(ENGINE_INDEX) + self._nq)
        self._rotation = 0  # successive kernels start on different DMA queues
        self._horizon = 0  # max(self._free): when the whole device is idle

    def submit(self, plan: KernelPlan, ready_ns: int = 0) -> KernelRun:
        """Place `plan` on the device, no instruction starting before `ready_ns`."""
        return KernelRun(plan, *self.place(plan, int(ready_ns)))

    def place(
        self, plan: KernelPlan, ready: int
    ) -> tuple[int, int, tuple[int, ...], int, int, int]:
        """Schedule `plan` at int `ready` or once the previous kernel has ended, whichever is
        later; returns the KernelRun fields after the plan (first start, last end, start
        offsets, queue offset, DMA queues, shift), cheaper to keep than a KernelRun."""
        nq, rot = self._nq, self._rotation
        if ready < self._horizon:
            ready = self._horizon
        if not plan.instrs:
            return ready, ready, (), 0, nq, 0
        free = self._free
        base = len(ENGINE_INDEX)
        self._rotation = (rot + plan.dma_queues_used) % nq
        if plan.dma_queues_used <= nq:
            # The device is idle by `ready`, so the plan runs exactly at its idle schedule
            # shifted to `ready` (a plan that needs more DMA queues than the chip has takes
            # the loop below).
            rel, last, first, final = plan.idle_schedule
            updates = plan.idle_updates.get((rot, nq))
            if updates is None:
                updates = plan.idle_updates[(rot, nq)] = tuple(
                    (base + (res + rot) % nq if is_dma else res, end) for is_dma, res, end in last
                )
            for res, end in updates:
                free[res] = ready + end
            self._horizon = ready + final
            # the idle schedule's offsets, shifted when the instructions are read
            return ready + first, ready + final, rel, rot, nq, ready
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
        end = max(ends)
        if end > self._horizon:
            self._horizon = end
        return min(starts), end, tuple(starts), rot, nq, 0

    def drain_ns(self) -> int:
        """When every engine and DMA queue is idle (what a sync waits for)."""
        return self._horizon

    def free_ns(self, track: str) -> int:
        """When `track` ("TensorE", ..., "DMA q3") finishes the work queued on it."""
        queue = dma_queue(track)
        if queue is not None:
            return self._free[len(ENGINE_INDEX) + queue]
        return self._free[ENGINE_INDEX[track]]

    def reset(self) -> None:
        self._free = [0] * len(self._free)
        self._rotation = 0
        self._horizon = 0

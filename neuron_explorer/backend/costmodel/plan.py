"""What lowering produces: tensors described by shape and dtype, instructions, kernel plans."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from math import prod
from typing import NamedTuple

from neuron_explorer.vocab.engines import COLLECTIVE_TRACK as CC
from neuron_explorer.vocab.engines import DMA_ENGINE as DMA
from neuron_explorer.vocab.engines import ENGINES as ENGINES
from neuron_explorer.vocab.engines import TENSOR_ENGINE

from .instr_table import Instr as Instr
from .instr_table import InstrTable

# Bytes per element by torch dtype name (without "torch.").
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "double": 8, "complex128": 16, "complex64": 8, "cfloat": 8, "cdouble": 16,
    "float32": 4, "float": 4, "int32": 4, "int": 4, "uint32": 4,
    "bfloat16": 2, "float16": 2, "half": 2, "int16": 2, "short": 2, "uint16": 2,
    "int64": 8, "long": 8, "uint64": 8,
    "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}  # fmt: skip

# the lanes a plan's non-DMA instructions run on: the compute engines, then the collective
# cores (CC), which run a compiled graph's collectives (costmodel/graph.py)
ENGINE_INDEX = {e: i for i, e in enumerate((*ENGINES, CC))}


def dtype_bytes(dtype: str) -> int:
    """Element size of a torch dtype name; unknown names count as 4 bytes."""
    return DTYPE_BYTES.get(dtype.removeprefix("torch."), 4)


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the cost model sees it: its shape and its torch dtype name."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    # stored with its last two dims swapped (a transposed view, column-major): as a matmul's
    # first operand it already has K leading, as TensorE wants it, so it needs no transposes
    transposed: bool = False

    def __post_init__(self) -> None:
        if type(self.shape) is not tuple:
            object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def itemsize(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


class Compute(NamedTuple):
    """Engine work before it is split into pipeline stages (the unit `fuse` recombines)."""

    engine: str
    opcode: str
    dur_ns: float  # the whole op's time on that engine
    flops: int
    repeat: int = 1  # instructions it takes
    utilization: float = 1.0
    sbuf_bytes: int = 0  # bytes read/written inside SBUF/PSUM by this work


@dataclass(frozen=True)
class KernelPlan:
    """A device kernel: its instructions in issue order plus totals over all of them."""

    name: str
    op: str
    instrs: Sequence[Instr]  # given as a tuple; kept as an InstrTable (instr_table.py)
    flops: int
    bytes_read: int  # HBM bytes read by the kernel's DMA
    bytes_written: int  # HBM bytes written by the kernel's DMA
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    computes: tuple[Compute, ...] = field(default=(), repr=False)
    category: str = "elementwise"
    spec: str = "trn2"  # name of the DeviceSpec it was lowered for
    gemms: tuple[tuple[int, int, int, int], ...] = ()  # (batch, M, K, N) of TensorE work

    def __post_init__(self) -> None:
        # the compile cache keeps every plan: its instructions as columns (instr_table.py)
        object.__setattr__(self, "instrs", InstrTable.of(self.instrs))

    @property
    def sched(self) -> list[tuple[int, bool, int, tuple[int, ...]]]:
        """(resource, is_dma, dur_ns, deps) per instruction, as the timeline schedules them:
        built when asked (a plan placed on an idle device reads only `idle_schedule`)."""
        instrs = self.instrs
        durs: Sequence[int]
        queues: Sequence[int]
        if isinstance(instrs, InstrTable):
            engines, deps = instrs.engines(), instrs.deps()
            durs, queues = instrs.column("dur_ns"), instrs.column("queue")
        else:
            engines, deps = [i.engine for i in instrs], [i.deps for i in instrs]
            durs, queues = [i.dur_ns for i in instrs], [i.queue for i in instrs]
        return [
            (q, True, dur, d) if e == DMA else (ENGINE_INDEX[e], False, dur, d)
            for e, dur, d, q in zip(engines, durs, deps, queues, strict=True)
        ]

    @cached_property
    def idle_schedule(self) -> tuple:
        """The plan scheduled alone from time 0 with the DMA rotation at 0: (starts, end per
        plan-relative resource, first start, last end). Where every resource the plan uses is
        free by its ready time, the timeline places it exactly at ready + these offsets. The
        starts are an int64 array (a sequence of ints), one per instruction."""
        free: dict[tuple[bool, int], int] = {}
        starts: list[int] = []
        ends: list[int] = []
        for res, is_dma, dur, deps in self.sched:
            t = free.get((is_dma, res), 0)
            for d in deps:
                if ends[d] > t:
                    t = ends[d]
            starts.append(t)
            t += dur
            ends.append(t)
            free[(is_dma, res)] = t
        last = tuple((is_dma, res, end) for (is_dma, res), end in free.items())
        first, final = min(starts, default=0), max(ends, default=0)
        try:
            return array("q", starts), last, first, final
        except (TypeError, OverflowError):  # durations that are not 64-bit ints: as they are
            return tuple(starts), last, first, final

    @property
    def is_empty(self) -> bool:
        """True for views and other ops with no device work."""
        return not self.instrs

    @cached_property
    def dma_queues_used(self) -> int:
        return 1 + max((q for q, is_dma, _d, _p in self.sched if is_dma), default=-1)

    @property
    def tensor_utilization(self) -> float | None:
        """Flop-weighted share of the TensorE array the kernel's tiles fill; None without TensorE."""
        work = [(i.flops, i.utilization) for i in self.instrs if i.engine == TENSOR_ENGINE]
        total = sum(f for f, _ in work)
        if not work or total == 0:
            return None
        # utilization = useful / issued, so issued = useful / utilization
        issued = sum(f / u for f, u in work if u > 0)
        return total / issued if issued else None

    @cached_property
    def idle_updates(self) -> dict:
        """(DMA rotation, DMA queues) -> ((timeline resource index, end offset), ...): the
        idle schedule's per-resource ends by timeline index, filled by the timeline's fast
        path as rotations come up."""
        return {}

    @cached_property
    def event_args(self) -> dict:
        """What a kernel event's `args` should carry: category, GEMM dims, TensorE utilization."""
        args: dict = {"category": self.category}
        if self.gemms:
            b, m, k, n = max(self.gemms, key=lambda g: g[0] * g[1] * g[2] * g[3])
            args["matmul"] = {"batch": b, "m": m, "k": k, "n": n}
            args["tensor_utilization"] = round(self.tensor_utilization or 0.0, 4)
        return args

    @property
    def arithmetic_intensity(self) -> float:
        """Flops per HBM byte moved (the roofline's x axis)."""
        moved = self.bytes_read + self.bytes_written
        return self.flops / moved if moved else float("inf")

"""A kernel plan's instructions stored as columns: the compile cache keeps every plan lowered
while recording, and a real-size model's optimizer steps lower to hundreds of thousands of
instructions (Llama-3-8B's 32 layers: 405,000 in 99 plans, 110 MiB as one `Instr` tuple each
with its schedule; as columns about 60 bytes each). Reading one gives back the same `Instr`,
field for field and type for type, so every reader of `plan.instrs` is unchanged.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload


class Instr(NamedTuple):
    """One instruction (or `repeat` identical ones in a row) of a kernel plan.

    `deps` are indices of earlier instructions of the same plan that must finish first; `queue`
    is the plan-relative DMA queue of a DMA transfer. `utilization` is the share of the engine's
    peak the work uses (for TensorE: the share of the 128x128 array the tiles fill). A NamedTuple,
    not a dataclass, because lowering builds thousands of them and a tuple is 5x cheaper to make.
    """

    engine: str
    opcode: str
    dur_ns: int
    deps: tuple[int, ...] = ()
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    queue: int = 0
    repeat: int = 1
    utilization: float = 1.0


# engine and opcode names, interned once per process: a plan keeps their small indices
_NAMES: list[str] = []
_NAME_INDEX: dict[str, int] = {}
# the integer columns in Instr's field order, and their array type codes ("q" int64, "i" int32)
_INT_FIELDS = ("dur_ns", "flops", "bytes_read", "bytes_written", "queue", "repeat")
_INT_CODES = ("q", "q", "q", "q", "i", "i")


def _name_index(name: str) -> int:
    i = _NAME_INDEX.get(name)
    if i is None:
        i = _NAME_INDEX[name] = len(_NAMES)
        _NAMES.append(name)
    return i


class InstrTable(Sequence[Instr]):
    """A plan's instructions as columns; indexing and iteration build each `Instr` anew."""

    __slots__ = ("_engine", "_opcode", "_deps", "_deps_of", "_ints", "_util", "__weakref__")

    def __init__(self, instrs: Sequence[Instr]) -> None:
        deps_at: dict[tuple[int, ...], int] = {}
        deps: list[tuple[int, ...]] = []
        deps_of = array("I")
        for ins in instrs:  # an instruction's deps are shared by many: each kept once
            d = deps_at.get(ins.deps)
            if d is None:
                d = deps_at[ins.deps] = len(deps)
                deps.append(ins.deps)
            deps_of.append(d)
        self._engine = array("H", [_name_index(i.engine) for i in instrs])
        self._opcode = array("H", [_name_index(i.opcode) for i in instrs])
        self._deps = tuple(deps)
        self._deps_of = deps_of
        self._ints = tuple(array(code, [getattr(i, f) for i in instrs])
                           for f, code in zip(_INT_FIELDS, _INT_CODES, strict=True))  # fmt: skip
        self._util = array("d", [i.utilization for i in instrs])

    @staticmethod
    def of(instrs: Sequence[Instr]) -> Sequence[Instr]:
        """`instrs` as a table, or as they are where columns would not give them back exactly
        (a float where an int is declared, an int beyond 64 bits, an int utilization)."""
        if type(instrs) is InstrTable or not instrs:
            return instrs
        ints = {type(v) for i in instrs for v in i[2:3] + i[4:9]}
        names = {type(v) for i in instrs for v in i[:2]}
        utils = {type(i.utilization) for i in instrs}
        if ints != {int} or names != {str} or utils != {float}:
            return tuple(instrs)
        try:
            return InstrTable(instrs)
        except OverflowError:
            return tuple(instrs)

    def __len__(self) -> int:
        return len(self._util)

    @overload
    def __getitem__(self, i: int) -> Instr: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[Instr, ...]: ...
    def __getitem__(self, i: int | slice) -> Instr | tuple[Instr, ...]:
        if isinstance(i, slice):
            return tuple(self)[i]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("instruction index out of range")
        dur, flops, read, written, queue, repeat = (c[i] for c in self._ints)
        return Instr(_NAMES[self._engine[i]], _NAMES[self._opcode[i]], dur,
                     self._deps[self._deps_of[i]], flops, read, written, queue, repeat,
                     self._util[i])  # fmt: skip

    def __iter__(self) -> Iterator[Instr]:
        names, deps = _NAMES, self._deps
        cols = zip(self._engine, self._opcode, self._deps_of, *self._ints, self._util, strict=True)
        for e, o, d, dur, flops, read, written, queue, repeat, util in cols:
            yield Instr(names[e], names[o], dur, deps[d], flops, read, written, queue, repeat,
                        util)  # fmt: skip

    def column(self, name: str) -> array:
        """One integer column (`dur_ns`, `queue`...) as an array, without building Instrs."""
        return self._ints[_INT_FIELDS.index(name)]

    def engines(self) -> list[str]:
        return [_NAMES[e] for e in self._engine]

    def deps(self) -> list[tuple[int, ...]]:
        return [self._deps[d] for d in self._deps_of]

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, InstrTable):
            return self._key() == other._key()
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def _key(self) -> tuple:
        return (self._engine, self._opcode, self.deps(), self._ints, self._util)

    def __repr__(self) -> str:
        return f"InstrTable({len(self)} instructions)"

    def __reduce__(self) -> tuple:
        return (InstrTable, (tuple(self),))

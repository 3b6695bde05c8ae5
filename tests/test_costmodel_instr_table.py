"""A kernel plan's instructions kept as columns (costmodel/instr_table.py) read back exactly:
the same `Instr`, field for field and type for type, as lowering built them."""

from __future__ import annotations

import pickle
from array import array

from neuron_explorer.backend.costmodel import DeviceTimeline, TensorInfo, get_spec, lower_op
from neuron_explorer.backend.costmodel.instr_table import InstrTable
from neuron_explorer.backend.costmodel.plan import Instr, KernelPlan


def _foreach_plan() -> KernelPlan:
    """An optimizer's multi-tensor op over many tensors: the plans that made the compile cache
    large (one DMA piece per tensor and stage)."""
    params = [TensorInfo((256, 128 + i), "float32") for i in range(24)]
    return lower_op("aten::_foreach_addcmul_", [*params, *params, *params], spec=get_spec("trn2"))


def test_a_lowered_plan_keeps_its_instructions_as_columns_and_reads_them_back_exactly() -> None:
    plan = _foreach_plan()
    assert isinstance(plan.instrs, InstrTable) and len(plan.instrs) > 100
    rows = tuple(plan.instrs)
    assert all(type(i) is Instr for i in rows)
    types = {tuple(type(v).__name__ for v in i) for i in rows}
    assert types == {("str", "str", "int", "tuple", "int", "int", "int", "int", "int", "float")}
    rebuilt = KernelPlan(plan.name, plan.op, rows, plan.flops, plan.bytes_read,
                         plan.bytes_written, plan.inputs, plan.outputs)  # fmt: skip
    assert rebuilt.instrs == plan.instrs and rebuilt.instrs == rows  # a table equals its rows
    assert hash(rebuilt.instrs) == hash(rows)
    assert plan.instrs[-1] == rows[-1] and plan.instrs[3:7] == rows[3:7]
    assert pickle.loads(pickle.dumps(plan.instrs)) == plan.instrs
    assert [i.deps for i in rows] == plan.instrs.deps()


def test_the_idle_schedule_is_the_one_the_instructions_give_and_placement_reads_it() -> None:
    plan = _foreach_plan()
    starts, _last, first, final = plan.idle_schedule
    assert isinstance(starts, array) and len(starts) == len(plan.instrs)
    ends = [s + i.dur_ns for s, i in zip(starts, plan.instrs, strict=True)]
    assert (first, final) == (min(starts), max(ends))
    run = DeviceTimeline(get_spec("trn2")).submit(plan, ready_ns=1_000)
    assert run.starts == tuple(1_000 + s for s in starts)
    assert [r.dur_ns for r in run.instrs] == [i.dur_ns for i in plan.instrs]


def test_instructions_that_columns_would_change_are_kept_as_they_are() -> None:
    exact = (Instr("VectorE", "tensor_tensor", 10, (), 5), Instr("DMA", "dma", 3, (0,)))
    assert isinstance(InstrTable.of(exact), InstrTable)
    for odd in (Instr("VectorE", "x", 10, (), 5.0), Instr("VectorE", "x", 10, (), 1 << 70),
                Instr("VectorE", "x", 10, utilization=1)):  # fmt: skip
        kept = InstrTable.of((*exact, odd))
        assert type(kept) is tuple and kept[-1] is odd
    assert InstrTable.of(()) == ()

"""What `events.drain()` returns (backend/runtime/drained.py): each kernel's instruction and
DMA events kept as rows of its plan and built when read, the same events at every reading."""

from __future__ import annotations

import dataclasses

import torch

from neuron_explorer import backend
from neuron_explorer.backend.runtime import events as ev_mod
from neuron_explorer.backend.runtime.drained import Drained, InstrRows


def _drained() -> Drained:
    x = torch.randn(64, 128, device="neuron")
    w = torch.randn(128, 96, device="neuron")
    backend.events.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        ((x @ w).relu() * 2).sum()
        torch.neuron.synchronize()
    return backend.events.drain()


def _values(events) -> list[tuple]:
    return [tuple(getattr(e, f.name) for f in dataclasses.fields(e)) for e in events]


def test_instruction_events_are_rows_built_when_read_the_same_at_every_reading() -> None:
    drained = _drained()
    assert isinstance(drained, Drained)
    rows = [x for x in drained.items if isinstance(x, InstrRows)]
    assert rows and sum(len(r) for r in rows) > 0
    first, again = list(drained), list(drained)
    assert _values(first) == _values(again) and len(drained) == len(first)
    assert drained[len(first) - 1] == first[-1]
    kernels = {e.id: e for e in first if e.kind == "kernel"}
    work = [e for e in first if e.kind in ("instruction", "dma")]
    assert work and all(e.parent_id in kernels for e in work)
    for e in work:  # an instruction carries its kernel's launch, line and module
        k = kernels[e.parent_id]
        assert (e.flow_id, e.op_name, e.src_line, e.module) == (k.flow_id, k.op_name,
                                                                k.src_line, k.module)  # fmt: skip
        assert k.device_start_ns <= e.device_start_ns
    ids = [e.id for e in first]
    assert len(set(ids)) == len(ids)
    assert not any(e.kind in ("instruction", "dma") for e in drained.whole())


def test_kept_events_come_back_first_as_rows_and_sorting_by_id_keeps_them() -> None:
    drained = _drained()
    values = _values(drained)
    ev_mod.keep(drained)
    back = ev_mod.drain()
    assert _values(back) == values
    assert [x for x in back.items if isinstance(x, InstrRows)]
    by_id = back.sorted_by_id()
    assert _values(by_id) == sorted(values, key=lambda v: v[0])
    calls = {e.id for e in back.whole() if e.kind == "runtime"}
    kept = back.select(lambda e: e.id in calls)
    assert {e.id for e in kept} == calls

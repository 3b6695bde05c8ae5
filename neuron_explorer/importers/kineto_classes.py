"""What each event of a Kineto trace becomes: its kind (from the category table, refined by
name), its layer, and whether it is a row, a flow point, a memory sample or a lane name."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kineto_extract import Decoded
from .kineto_kinds import (
    COLLECTIVE_PREFIXES,
    DMA_PREFIX,
    LANE_NAME_EVENTS,
    MEMORY_EVENT,
    MTIA_CATEGORIES,
    STEP_NAME,
    K,
    roles,
)


@dataclass(frozen=True)
class Classes:
    """Per event: kind (refined by name) and layer, what it becomes; per distinct name: step
    number (-1 if not a step)."""

    names: list[str]
    kind: np.ndarray  # int8 index into KINDS
    device: np.ndarray  # bool: device layer
    step_no: np.ndarray  # by name code
    is_flow: np.ndarray  # bool: a flow event (ph s, f, t)
    is_counter: np.ndarray  # bool: a [memory] sample (goes to counters)
    is_row: np.ndarray  # bool: a row of the events table
    is_lane_name: np.ndarray  # bool: thread_name / process_name metadata
    mtia: np.ndarray  # bool: device work of an MTIA category


def classify(d: Decoded) -> Classes:
    """Kinds from the category table, refined by name (steps, collectives, MTIA DMAs), decided
    once per distinct category and name and spread to events by their codes."""
    names = d.name_list
    step_no = np.array([_step_number(s) for s in names], dtype=np.int64)
    coll_name = np.array([s.lower().startswith(COLLECTIVE_PREFIXES) for s in names], dtype=bool)
    nccl = np.array(["nccl" in s.lower() for s in names], dtype=bool)
    dma = np.array([s.startswith(DMA_PREFIX) for s in names] or [False], dtype=bool)
    memory = np.array([s == MEMORY_EVENT for s in names] or [False], dtype=bool)
    lane = np.array([s in LANE_NAME_EVENTS for s in names] or [False], dtype=bool)
    r = roles(d.ph, d.cat_code, d.cats, memory[d.name_code], lane[d.name_code])
    mtia = np.array([c.lower() in MTIA_CATEGORIES for c in d.cats] or [False])[d.cat_code]
    kind = r.kind.copy()
    if d.n:
        code = d.name_code
        # old traces (torch < 1.9) put ProfilerStep#N under cat Operator, as an op
        is_step = (step_no >= 0)[code]  # a bool an event, not the int64 step numbers
        named_step = ((kind == K["annotation"]) | (kind == K["op"])) & is_step
        del is_step
        kind[named_step] = K["step"]
        kind[(kind == K["annotation"]) & coll_name[code]] = K["collective"]
        kind[(kind == K["gpu_kernel"]) & nccl[code]] = K["collective"]
        kind[(kind == K["gpu_kernel"]) & mtia & dma[code]] = K["gpu_memcpy"]
    return Classes(
        names, kind, r.device, step_no, r.is_flow, r.is_counter, r.is_row, r.is_lane_name, mtia
    )


def _step_number(name: str) -> int:
    m = STEP_NAME.match(name)
    return int(m.group(1)) if m else -1

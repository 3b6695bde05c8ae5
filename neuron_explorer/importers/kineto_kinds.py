"""What a Kineto event becomes: kind and layer from its category, and whether it is a row of the
events table, a flow point or a memory sample. The range decoder needs this per event to decode
the typed args of ops, launches and memory samples; the mapping refines kinds by name."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..vocab.kinds import EVENT_KINDS

# Kineto category (lower case) -> (kind, layer)
CATEGORIES: dict[str, tuple[str, str]] = {
    "cpu_op": ("op", "host"), "operator": ("op", "host"),
    "user_annotation": ("annotation", "host"),
    "python_function": ("python", "host"),
    "cuda_runtime": ("runtime", "host"), "cuda_driver": ("runtime", "host"),
    "runtime": ("runtime", "host"), "driver": ("runtime", "host"),
    "privateuse1_runtime": ("runtime", "host"), "privateuse1_driver": ("runtime", "host"),
    "kernel": ("gpu_kernel", "device"),
    "gpu_memcpy": ("gpu_memcpy", "device"), "memcpy": ("gpu_memcpy", "device"),
    "gpu_memset": ("gpu_memset", "device"), "memset": ("gpu_memset", "device"),
    "gpu_user_annotation": ("gpu_annotation", "device"),
    "cuda_sync": ("sync", "device"),
    # MTIA: device work and runtime calls, as HTA reads them
    "mtia_ccp_events": ("gpu_kernel", "device"), "mtia_runtime": ("runtime", "host"),
}  # fmt: skip
# device work of these categories runs on an MTIA device (the rest: cuda, ROCm included)
MTIA_CATEGORIES = ("mtia_ccp_events",)
# MTIA device work whose name starts so is a DMA copy (HTA's memory kernels: ^dma)
DMA_PREFIX = "dma"
K = {name: i for i, name in enumerate(EVENT_KINDS)}  # kind name -> code in the int8 kind arrays
KIND_NAMES = pa.array(EVENT_KINDS, pa.string())
FLOW_PHASES = ("s", "f", "t")
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
COLLECTIVE_PREFIXES = ("nccl:", "gloo:", "ucc:", "mpi:", "c10d::")
MEMORY_EVENT = "[memory]"
LANE_NAME_EVENTS = ("thread_name", "process_name")  # ph M metadata that names lanes


@dataclass(frozen=True)
class Roles:
    """Per event: kind by category (int8 code), device layer, and what the event becomes."""

    kind: np.ndarray
    device: np.ndarray
    is_flow: np.ndarray  # a flow point (ph s, f, t)
    is_counter: np.ndarray  # a [memory] sample (goes to counters)
    is_row: np.ndarray  # a row of the events table
    is_lane_name: np.ndarray  # thread_name / process_name metadata (names the lanes)

    def typed_subsets(self) -> dict[str, np.ndarray]:
        """The events whose args decode into typed columns (bool masks): ops, launches and
        device work, memory samples, lane names."""
        return {
            "op": self.is_row & (self.kind == K["op"]),
            "gpu": self.is_row & ((self.kind == K["runtime"]) | self.device),
            "mem": self.is_counter,
            "lane": self.is_lane_name,
        }


def roles(
    ph: np.ndarray,
    cat_code: np.ndarray,
    cats: list[str],
    memory_name: np.ndarray,
    lane_name: np.ndarray,
) -> Roles:
    """Roles of events from their phase, category code (into `cats`) and whether the name is
    the memory event's (`memory_name`, per event) or a lane-naming metadata event's
    (`lane_name`)."""
    by_cat = [CATEGORIES.get(c.lower(), ("other", "host")) for c in cats]
    kind = np.array([K[k] for k, _ in by_cat] or [K["other"]], dtype=np.int8)[cat_code]
    device = np.array([layer == "device" for _, layer in by_cat] or [False])[cat_code]
    is_flow = np.zeros(len(ph), dtype=bool)
    for phase in FLOW_PHASES:  # not np.isin: on text it sorts, a few columns of the events
        is_flow |= phase_is(ph, phase)
    is_meta = phase_is(ph, "M")
    is_counter = memory_name & ~phase_is(ph, "X")
    is_row = ~is_flow & ~is_counter & ~is_meta
    return Roles(kind, device, is_flow, is_counter, is_row, lane_name & is_meta)


def phase_is(ph: np.ndarray, phase: str) -> np.ndarray:
    """ph == phase, per event. One-letter phases (a U1 array: every trace's) are compared as
    their code points: numpy compares text by a loop per element, 17 times slower."""
    if ph.dtype == np.dtype("U1") and len(phase) == 1:
        return ph.view(np.uint32) == ord(phase)
    return ph == phase

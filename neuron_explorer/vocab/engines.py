"""The lanes of a modeled NeuronCore, named and ordered once: the kernel lane, the four compute
engines, the DMA queues and the collective lane. The backend records work on them, analysis
measures them, and the timeline, the Perfetto export and the summary page show them in this
order (the page gets it from the server: the summary's engines come sorted by `lane_order`)."""

from __future__ import annotations

import re

KERNEL_TRACK = "kernels"  # the lane of whole kernels, above the engines that run them
TENSOR_ENGINE = "TensorE"  # the systolic matmul array
ENGINES = (TENSOR_ENGINE, "VectorE", "ScalarE", "GpSimdE")  # compute engines, in reading order
DMA_PREFIX = "DMA q"  # one lane per DMA queue: "DMA q0", "DMA q1", ...
DMA_ENGINE = "DMA"  # every DMA queue of a core counted as one engine (utilization)
COLLECTIVE_TRACK = "CC"  # the lane of collectives on the device

_FIXED = (KERNEL_TRACK, *ENGINES)


def dma_track(queue: int) -> str:
    """The lane of DMA queue `queue`."""
    return f"{DMA_PREFIX}{queue}"


def dma_queue(track: str) -> int | None:
    """The queue number of a DMA lane, else None."""
    tail = track[len(DMA_PREFIX) :]
    return int(tail) if track.startswith(DMA_PREFIX) and tail.isdigit() else None


def natural_key(text: str) -> tuple:
    """`text` split into text and numbers, so that "stream 10" sorts after "stream 7"."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def lane_order(track: str) -> tuple:
    """Sort key of a device lane: kernels, then TensorE, VectorE, ScalarE, GpSimdE, then any
    other lane (collectives, CUDA streams) naturally, then the DMA queues (and DMA as one)."""
    if track in _FIXED:
        return (0, _FIXED.index(track), ())
    if track == DMA_ENGINE or track.startswith(DMA_PREFIX):
        return (2, 0, natural_key(track))
    return (1, 0, natural_key(track))

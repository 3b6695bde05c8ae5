"""Every event kind a profile may hold, and the groups of kinds each layer reads, declared once.

A kind is what an event is (an op, a kernel, a DMA...); the profile writer refuses a kind that is
not declared here (model/io.py), so a producer cannot invent one that analysis never reads.
docs/format.md lists them for producers of profiles.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

LAYERS = ("host", "device")


@dataclass(frozen=True)
class Kind:
    name: str
    doc: str


DECLARED: tuple[Kind, ...] = (
    Kind("python", "A Python function call (torch.profiler with_stack)."),
    Kind("op", "A framework operator (aten op, torch function)."),
    Kind("annotation", "A user or library record_function span."),
    Kind("step", "A training step (ProfilerStep#N)."),
    Kind("runtime", "A runtime or driver call (cudaLaunchKernel, a neuron launch, a downcast)."),
    Kind("compile", "A neuron compile: an eager op's first use or a torch.compile graph."),
    Kind("fallback", "An op the neuron device ran on the host CPU."),
    Kind("sync", "A host wait for the device (.item(), .cpu(), a CUDA synchronize)."),
    Kind("copy", "A host-device transfer made by the neuron runtime."),
    Kind("kernel", "A neuron device kernel: the device program of one op or fused graph."),
    Kind("instruction", "One engine instruction of a neuron kernel."),
    Kind("dma", "One DMA transfer of a neuron kernel (or an MTIA DMA kernel)."),
    Kind("collective", "A collective (all-reduce, all-gather...) as device work."),
    Kind("gpu_kernel", "A GPU (CUDA, ROCm, MTIA) kernel."),
    Kind("gpu_memcpy", "A GPU memory copy."),
    Kind("gpu_memset", "A GPU memory set."),
    Kind("gpu_annotation", "A record_function span on a GPU stream."),
    Kind("memory", "A neuron memory sample (capture puts them in counters; old profiles)."),
    Kind(
        "allocation",
        "A device memory allocation, from its allocation to its free (a memory snapshot's).",
    ),
    Kind("other", "Anything a trace holds that no other kind names."),
)
EVENT_KINDS: tuple[str, ...] = tuple(k.name for k in DECLARED)

# Groups (each a subset of EVENT_KINDS: tests/test_vocab.py checks it).
FRAMEWORK_KINDS = ("op", "annotation")  # framework spans (what launches a runtime call)
# The neuron runtime's host calls and its modeled device work, as capture places them.
NEURON_HOST_KINDS = ("compile", "runtime", "fallback", "sync", "copy")
NEURON_DEVICE_KINDS = ("kernel", "instruction", "dma", "collective")
# Device work that occupies a device (the union of these is device busy time).
DEVICE_WORK_KINDS = ("gpu_kernel", "gpu_memcpy", "gpu_memset", "kernel", "dma", "collective")
# Device work that computes (kernel level), that communicates (NCCL/gloo kernels, neuron
# collectives: HTA's COMMUNICATION kernels, which HTA keeps out of compute), and that moves data
# (HTA's MEMORY kernels: memcpy, memset; neuron DMA).
COMPUTE_KINDS = ("gpu_kernel", "kernel")
COMMUNICATION_KINDS = ("collective",)
TRANSFER_KINDS = ("gpu_memcpy", "gpu_memset", "dma")
# Kernel launches counted per step (collectives are counted apart).
KERNEL_KINDS = ("gpu_kernel", "kernel")
# Device work that only a GPU (CUDA, ROCm, MTIA) trace holds: it makes a profile a GPU one.
GPU_WORK_KINDS = ("gpu_kernel", "gpu_memcpy", "gpu_memset")
# Device work charged to the framework op that launched it (operator and source-line tables).
LAUNCHED_KINDS = ("kernel", "gpu_kernel", "gpu_memcpy", "gpu_memset", "collective")

# Records of the neuron runtime that mark the clock but are not events of their own:
# "forward": a metadata op (view, reshape...) launched no kernel but created autograd node
# `seq_nr` at its user line, for the backward kernels to inherit;
# "gc": a garbage-collector pause outside the backend's calls, cut as simulator time;
# "cut": a metadata op's span (no runtime cost), cut as simulator time.
RUNTIME_MARKERS = ("forward", "gc", "cut")
# Everything the neuron runtime records: its host calls, device work, memory and markers.
RUNTIME_KINDS = (*NEURON_HOST_KINDS, *NEURON_DEVICE_KINDS, "memory", *RUNTIME_MARKERS)
RUNTIME_HOST_KINDS = frozenset((*NEURON_HOST_KINDS, "memory", *RUNTIME_MARKERS))

_DECLARED_SET = frozenset(EVENT_KINDS)


def undeclared(kinds: Iterable[str | None]) -> list[str]:
    """The kinds among `kinds` that are not declared event kinds, sorted (None counts)."""
    return sorted({str(k) for k in kinds if k not in _DECLARED_SET})


def kinds_doc() -> str:
    """The declared kinds as a comma-separated list (the schema's `kind` column says it)."""
    return ", ".join(EVENT_KINDS)


def sql_list(values: Iterable[str]) -> str:
    """A SQL list literal of string constants, e.g. ('a', 'b'): kinds in a WHERE ... IN."""
    quoted = ["'" + v.replace("'", "''") + "'" for v in values]
    return "(" + ", ".join(quoted) + ")"

"""The event conventions analysis reads, declared once: which kinds are device work, which
runtime calls block the host, how data-loader and optimizer spans are named. docs/rules.md
describes the same conventions for producers of profiles."""

from __future__ import annotations

from ..vocab.engines import ENGINES, TENSOR_ENGINE

# The groups of event kinds are the vocabulary's (vocab/kinds.py); the rules import them here.
from ..vocab.kinds import (  # noqa: F401
    COMMUNICATION_KINDS,
    COMPUTE_KINDS,
    DEVICE_WORK_KINDS,
    KERNEL_KINDS,
    TRANSFER_KINDS,
    sql_list,
)

# Host runtime calls that block the host until the device catches up.
SYNC_RUNTIME_NAMES = (
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpy2D", "cudaMemcpyFromSymbol", "cudaMemcpyToSymbol",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy",
    "hipMemcpyWithStream",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
)  # fmt: skip

# torch.profiler names the DataLoader's __next__ "enumerate(DataLoader)#_...Iter.__next__".
DATALOADER_LIKE = ("enumerate(DataLoader)%", "%DataLoader%__next__%")
# torch.optim wraps step() in record_function("Optimizer.step#<Class>.step").
OPTIMIZER_STEP_LIKE = "Optimizer.step#%"
# Multi-tensor and fused optimizer kernels; their presence means the optimizer is not per-param.
FUSED_OPTIMIZER_LIKE = ("%_foreach_%", "%_fused_%")
# Neuron capture conventions (see docs/rules.md, "Event conventions").
NEURON_SYNC_KIND = "sync"
NEURON_COPY_KIND = "copy"
DOWNCAST_EVENT = "downcast"  # kind runtime, args {"from": "float64", "to": "float32"}
# A float64 downcast: an explicit downcast event, or a neuron kernel given float64 inputs (the
# device computes them as float32).
DOWNCAST_PREDICATE = (
    f"((kind = 'runtime' AND name = '{DOWNCAST_EVENT}') OR (layer = 'device' "
    "AND kind = 'kernel' AND regexp_matches(coalesce(dtypes, ''), 'float64|double')))"
)
# Recompiles: the neuron compiler's "recompile" events, or compiles with args.reason recompile.
RECOMPILE_PREDICATE = (
    "(kind = 'compile' AND (name = 'recompile' "
    "OR json_extract_string(args, '$.reason') = 'recompile'))"
)
# The compiled graph a compile belongs to: neuron_graph_<graph>_<signature>[_forward|_backward]
# -> neuron_graph_<graph>; signature 0 is the graph's first compile, later ones recompiles.
COMPILE_GROUP_SQL = (
    "regexp_replace(coalesce(op_name, name), "
    "'^(neuron_graph_[0-9]+)_[0-9]+(_forward|_backward)?$', '\\1')"
)
# One compiled program: an eager op, or a graph signature (its forward and backward together).
PROGRAM_SQL = (
    "regexp_replace(coalesce(op_name, name), "
    "'^(neuron_graph_[0-9]+_[0-9]+)_(forward|backward)$', '\\1')"
)


# torch.compile's own spans (dynamo's record_functions): tracing the frame, AOT autograd and the
# backend compile of the forward, and the backward's compile on its first run. Host time in them
# is compile time, most of it real Python that no backend compile event covers.
TRACE_COMPILE_NAMES = ("entire_frame_compile", "entire_backward_compile")
TRACE_COMPILE_PREDICATE = (
    f"(layer = 'host' AND kind IN ('op', 'annotation') AND name IN {sql_list(TRACE_COMPILE_NAMES)})"
)
GRAPH_RECOMPILE_SQL = "regexp_matches(coalesce(op_name, ''), '^neuron_graph_[0-9]+_[1-9][0-9]*')"
# Kinds whose args JSON the rules read (analysis keeps args only for these, and downcasts).
ARGS_KINDS = ("compile", "copy", "sync", "kernel", "fallback", "dma", "collective")
ENGINE_TRACKS = ENGINES  # the compute engines' lanes (vocab/engines.py)
TENSOR_ENGINE_TRACK = TENSOR_ENGINE


def sync_predicate(alias: str = "") -> str:
    """SQL condition true for host events that wait for the device (alias: table prefix)."""
    a = f"{alias}." if alias else ""
    return (
        f"(({a}kind = '{NEURON_SYNC_KIND}' AND {a}layer = 'host') "
        f"OR ({a}kind = 'runtime' AND {a}name IN {sql_list(SYNC_RUNTIME_NAMES)}))"
    )

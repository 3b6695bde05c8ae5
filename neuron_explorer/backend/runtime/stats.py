"""Compile counters for eager kernels and torch.compile graphs."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_explorer.backend.runtime import tracking

graph = {"graph_compiles": 0, "graph_recompiles": 0}
# graph code -> input-shape signatures compiled since start or the last reset_compile_stats()
graph_signatures: dict[str, set] = {}


@dataclass(frozen=True)
class CompileStats:
    """How often the runtime compiled: eager (op, shapes, dtypes) keys and torch.compile graphs."""

    eager_compiles: int
    eager_cache_hits: int
    graph_compiles: int  # every backend call: one per graph and input-shape signature
    graph_recompiles: int  # compiles of a graph already seen with other input shapes


def compile_stats() -> CompileStats:
    """Counters since start (or the last reset_compile_stats())."""
    return CompileStats(**tracking.stats, **graph)


def reset_compile_stats() -> None:
    """Zero the counters, empty the eager compile cache and forget the graph shapes seen (the
    next compile of a graph is a first compile again, the one after with new shapes a
    recompile)."""
    tracking.stats.update(eager_compiles=0, eager_cache_hits=0)
    tracking.clear_compile_cache()
    graph.update(graph_compiles=0, graph_recompiles=0)
    graph_signatures.clear()

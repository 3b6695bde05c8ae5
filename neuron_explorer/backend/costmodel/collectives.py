"""Modeled time of a collective between chips: ring and tree algorithms over NeuronLink or EFA.

The model puts one rank on one chip. Within a NeuronLink domain (an instance, `chips_per_node`
chips) a collective runs at the chip's NeuronLink bandwidth; a group that spans instances is
limited by the EFA bandwidth per chip. Each ring or tree step also pays `step_latency_ns`, and
each collective `launch_ns` once.
Bandwidth terms follow the usual ring bounds (NCCL's "bus bandwidth" accounting): an all-reduce
moves 2(n-1)/n of the buffer through every chip, an all-gather or reduce-scatter (n-1)/n of the
whole (gathered) buffer, an all-to-all (n-1)/n of its input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .spec import CollectiveSpec

# what each collective is, as the ring/tree model sees it
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, ALL_TO_ALL, P2P, BARRIER, REDUCE = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "p2p", "barrier",
    "reduce",
)  # fmt: skip


@dataclass(frozen=True)
class CollectiveCost:
    """The modeled transfer of one collective on one rank."""

    transfer_ns: int
    algorithm: str  # ring | tree | direct
    link: str  # neuronlink | efa
    bus_bytes: int  # bytes that cross this chip's links


def collective_cost(kind: str, nbytes: int, world_size: int, cc: CollectiveSpec) -> CollectiveCost:
    """Time for `kind` over `nbytes` (the full buffer: the gathered output for an all-gather,
    the unreduced input for a reduce-scatter) among `world_size` ranks."""
    n = max(1, world_size)
    link = "neuronlink" if n <= cc.chips_per_node else "efa"
    bw = cc.link_bytes_per_s if link == "neuronlink" else min(cc.efa_bytes_per_s,
                                                              cc.link_bytes_per_s)  # fmt: skip
    if n == 1:
        return CollectiveCost(0, "direct", link, 0)
    log_n = math.ceil(math.log2(n))
    if kind == ALL_REDUCE:
        bus, steps, algo = 2 * (n - 1) * nbytes / n, 2 * (n - 1), "ring"
    elif kind in (ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL):
        bus, steps, algo = (n - 1) * nbytes / n, n - 1, "ring"
    elif kind in (BROADCAST, REDUCE):
        bus, steps, algo = nbytes, log_n, "tree"  # pipelined down (or up) a binary tree
    elif kind == BARRIER:
        bus, steps, algo = 0, 2 * log_n, "tree"
    else:  # point to point
        bus, steps, algo = nbytes, 1, "direct"
    ns = cc.launch_ns + bus * 1e9 / bw + steps * cc.step_latency_ns
    return CollectiveCost(int(ns), algo, link, int(bus))

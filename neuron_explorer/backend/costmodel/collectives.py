"""Modeled time of a collective between NeuronCores: the algorithms the Neuron runtime picks by
message size, over NeuronLink within an instance or EFA between instances.

A rank is a NeuronCore; an instance holds `ranks_per_node` of them (`chips_per_node` chips).
Within an instance a collective runs at the NeuronLink bandwidth; a group that spans instances
is limited by the EFA bandwidth per chip. Each collective pays `launch_ns` once and
`step_latency_ns` per hop; how many hops depends on the algorithm, which the runtime picks by
size within an instance (AWS's "Intra-node Collective Communications"): mesh under
`mesh_max_bytes` (every rank writes to every other directly: one hop for an all-gather or a
reduce-scatter, two for an all-reduce, whatever the group's size), recursive doubling-halving
under `rdh_max_bytes` (log2 n hops a pass), the ring past both (n - 1 hops a pass). Across
instances the ring is modeled at every size.
Bandwidth terms follow the usual bounds (NCCL's "bus bandwidth" accounting), the same for
every algorithm: an all-reduce moves 2(n-1)/n of the buffer through every rank, an all-gather
or reduce-scatter (n-1)/n of the whole (gathered) buffer, an all-to-all (n-1)/n of its input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from neuron_explorer.vocab.device_spec import CollectiveSpec

# what each collective is, as the ring/tree model sees it
ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, ALL_TO_ALL, P2P, BARRIER, REDUCE = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "p2p", "barrier",
    "reduce",
)  # fmt: skip


@dataclass(frozen=True)
class CollectiveCost:
    """The modeled transfer of one collective on one rank."""

    transfer_ns: int
    algorithm: str  # mesh | rdh | ring | tree | direct
    link: str  # neuronlink | efa
    bus_bytes: int  # bytes that cross this chip's links


def collective_cost(kind: str, nbytes: int, world_size: int, cc: CollectiveSpec) -> CollectiveCost:
    """Time for `kind` over `nbytes` (the full buffer: the gathered output for an all-gather,
    the unreduced input for a reduce-scatter) among `world_size` ranks."""
    n = max(1, world_size)
    in_node = n <= (cc.ranks_per_node or cc.chips_per_node)
    link = "neuronlink" if in_node else "efa"
    bw = cc.link_bytes_per_s if in_node else min(cc.efa_bytes_per_s, cc.link_bytes_per_s)
    if n == 1:
        return CollectiveCost(0, "direct", link, 0)
    log_n = math.ceil(math.log2(n))
    if kind in (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER):
        passes = 2 if kind == ALL_REDUCE else 1  # an all-reduce is a reduce-scatter + all-gather
        bus = passes * (n - 1) * nbytes / n
        if in_node and nbytes < cc.mesh_max_bytes:
            steps, algo = passes, "mesh"
        elif in_node and nbytes < cc.rdh_max_bytes:
            steps, algo = passes * log_n, "rdh"
        else:
            steps, algo = passes * (n - 1), "ring"
    elif kind == ALL_TO_ALL:
        bus, steps, algo = (n - 1) * nbytes / n, n - 1, "ring"
    elif kind in (BROADCAST, REDUCE):
        bus, steps, algo = nbytes, log_n, "tree"  # pipelined down (or up) a binary tree
    elif kind == BARRIER:
        bus, steps, algo = 0, 2 * log_n, "tree"
    else:  # point to point
        bus, steps, algo = nbytes, 1, "direct"
    ns = cc.launch_ns + bus * 1e9 / bw + steps * cc.step_latency_ns
    return CollectiveCost(int(ns), algo, link, int(bus))

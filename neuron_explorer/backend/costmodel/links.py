"""Collective links and algorithms per chip generation, each with its public source (read
through spec.py's DeviceSpecs; the shape is vocab/device_spec.py's CollectiveSpec)."""

from __future__ import annotations

from neuron_explorer.vocab.device_spec import CollectiveSpec

DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest"
SRC_CC_INTRANODE = f"{DOCS}/neuron-runtime/explore/intranode-collective-comm.html"

# Collective links per chip generation; the sources are in each DeviceSpec's `sources`.
# trn1: nccom-test's 2-rank all-reduce (tools/neuron-sys-tools/nccom-test.rst) runs at a 58 us
# floor up to 64 KiB (two 2 us hops, so 54 us of fixed cost) and 52.83 GB/s of bus bandwidth
# at 1 GiB: the one published trn1 collective curve, so its link figures. Within an instance
# the runtime picks the algorithm by size (intranode-collective-comm.html): mesh under 1 MB
# (O(1) hops), recursive doubling-halving to 56 MB (O(log n)), ring-like past it
_MESH_MAX, _RDH_MAX = 1 << 20, 56 << 20
CC_TRN1 = CollectiveSpec(52.83e9, 800e9 / 8 / 16, 16, 2_000, 54_000, 32, _MESH_MAX, _RDH_MAX)
CC_TRN2 = CollectiveSpec(1.28e12, 3.2e12 / 8 / 16, 16, 2_000, 0, 64, _MESH_MAX, _RDH_MAX)
CC_TRN3 = CollectiveSpec(2.56e12, 3.2e12 / 8 / 16, 16, 2_000, 0, 64, _MESH_MAX, _RDH_MAX)
_CC_SOURCES = (
    ("collectives.chips_per_node", "trn1.32xlarge / trn2.48xlarge: 16 chips per instance"),
    (
        "collectives.step_latency_ns",
        SRC_CC_INTRANODE + ": the per-hop latency of Ring/KangaRing is about 1-2 us",
    ),
    (
        "collectives.mesh_max_bytes",
        SRC_CC_INTRANODE + ": Mesh (O(1) latency) is the algorithm for messages under 1 MB",
    ),
    (
        "collectives.rdh_max_bytes",
        SRC_CC_INTRANODE + ": recursive doubling-halving (O(log n)) for 1-56 MB, ring past it",
    ),
)

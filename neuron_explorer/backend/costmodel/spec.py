"""Hardware figures of one NeuronCore per chip generation, each with its public source (and,
through costmodel/lnc.py, of trn2's and trn3's logical cores of two physical ones).

Every constant the cost model uses lives here; lowering and the timeline only read a DeviceSpec
(the dataclasses are the vocabulary's: neuron_explorer/vocab/device_spec.py).
Figures marked ASSUMPTION are not published by AWS and are our estimate (see docs/costmodel.md).
"""

from __future__ import annotations

import os

from neuron_explorer.vocab.device_spec import (
    DeviceSpec,
    EngineSpec,
    ModelPolicy,
    RuntimeSpec,
)

from . import lnc
from .links import _CC_SOURCES, CC_TRN1, CC_TRN2, CC_TRN3, SRC_CC_INTRANODE

ENV_VAR = "NEURON_DEVICE_SPEC"
DEFAULT_SPEC = "trn2"

_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest"
SRC_TRN1_NKI = f"{_DOCS}/nki/arch/trainium_inferentia2_arch.html"
SRC_TRN1_CORE = f"{_DOCS}/general/arch/neuron-hardware/neuron-core-v2.html"
SRC_TRN1_CHIP = f"{_DOCS}/general/arch/neuron-hardware/trainium.html"
SRC_TRN2_NKI = f"{_DOCS}/nki/about/trainium2_arch.html"
SRC_TRN2_CORE = f"{_DOCS}/about-neuron/arch/neuron-hardware/neuron-core-v3.html"
SRC_TRN2_CHIP = f"{_DOCS}/about-neuron/arch/neuron-hardware/trainium2.html"
SRC_TRN3_NKI = f"{_DOCS}/nki/about/trainium3_arch.html"
SRC_TRN3_CORE = f"{_DOCS}/about-neuron/arch/neuron-hardware/neuron-core-v4.html"
SRC_TRN3_CHIP = f"{_DOCS}/about-neuron/arch/neuron-hardware/trainium3.html"
SRC_DMA_GUIDE = f"{_DOCS}/nki/deep-dives/nki-dma-bandwidth-guide.html"
SRC_NKI_ISA = f"{_DOCS}/nki/api/nki.isa.html"
SRC_DMA_OVERVIEW = f"{_DOCS}/nki/about/nki-dma-overview.html"
SRC_NCCOM = (
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/nccom-test.html"
)
SRC_NKI_RECIPROCAL = f"{_DOCS}/general/nki/api/generated/nki.isa.reciprocal.html"
SRC_NKI_TENSOR_SCALAR = f"{_DOCS}/general/nki/api/generated/nki.isa.tensor_scalar.html"
SRC_ISSUE = "issue 3 of this project (figure given by the lead; not found in the pages above)"
ASSUMPTION = "ASSUMPTION (not published; see docs/costmodel.md)"

_ENGINE_SOURCES = (
    (
        "vector.reciprocal_cost",
        SRC_NKI_RECIPROCAL + " (Inf2, Trn1, Trn2): max(MIN_II, 8*N) cycles on Vector Engine, "
        "N on Scalar Engine; trn3: " + ASSUMPTION + " as trn2",
    ),
    (
        "tensor_scalar placement",
        SRC_NKI_TENSOR_SCALAR + ": runs on Vector, Scalar or GpSimd Engine; neuronx-cc's own "
        "kernels (NKIBench) leave the engine to the compiler",
    ),
)

# How the modeled compiler tiles and pipelines work (model choices, not chip facts).
POLICY = ModelPolicy(
    max_stages=8,  # a kernel's work is split into at most this many pipelined stages
    # ... each moving at least this much HBM traffic, so every DMA queue gets pieces large
    # enough (~256 KiB) to amortise the per-transfer latency
    stage_min_bytes=4 << 20,
    dma_piece_min_bytes=64 << 10,  # a stage's tensor is spread over queues in pieces >= this
    engine_tile_elems=128 * 512,  # elements one Vector/Scalar/GpSimd instruction handles
    sbuf_operand_share=0.5,  # share of SBUF a matmul keeps its operands in
    # share of SBUF a NEFF keeps live intermediates in (the other half double-buffers the
    # operands streamed from HBM): an assumption, as the compiler's allocator is not published
    sbuf_resident_share=0.5,
    # a NEFF's matmul-free loop (an elementwise chain, AdamW) in up to 32 stages: neuronx-cc's
    # own loops of that kind run 172-224 iterations of 512 KiB (NKIBench's AdamW and silu)
    loop_max_stages=32,
)

_MIB = 1 << 20
_GIB = 1 << 30

# Host-side runtime costs are not published per call; the same estimates serve every chip except
# PCIe bandwidth (Gen4 on trn1, Gen5 on trn2/trn3, both at a practical ~40% of the link).
# launch_ns, metadata_ns and free_ns are the host's own work: the runtime measures them on the
# host running the program (backend/runtime/hostcal.py) and these figures are its fallback
# (NEURON_HOST_COSTS=spec); the rest are the device's and stay as written.
_RUNTIME_SOURCES = (
    # the HOST's cost of launching one already-compiled kernel. AWS publishes no per-call
    # figure; its runtime docs say the host only prepares and enqueues a request when
    # execution is asynchronous (runtime-performance-tips: nrt_execute "return[s] immediately
    # after preparing and enqueuing a request" with NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS;
    # nrt-async-api-core-concepts: "Scheduling calls do not block"), so the latency belongs to
    # the device queue, not the host. 4 us is our estimate of that enqueue: a request filled
    # and a queue written, the order of the plain CPU's own per-op dispatch measured here
    # (1.4-3 us for an aten op with no kernel work: benchmarks/host_clock_table.py). Was 12 us
    # ("order of 10 us", no source), 2.4 ms of a tiny GPT-2 step's 201 launches (issue 14).
    ("runtime.launch_ns", ASSUMPTION + ": the host's async enqueue of one compiled kernel"),
    ("runtime.eager_compile_ns", ASSUMPTION + ": eager per-op kernel build on first use"),
    ("runtime.graph_compile_ns_base", ASSUMPTION + ": neuronx-cc graph compile, seconds"),
    ("runtime.graph_compile_ns_per_node", ASSUMPTION),
    ("runtime.h2d_bytes_per_s", ASSUMPTION + ": practical PCIe throughput"),
    ("runtime.d2h_bytes_per_s", ASSUMPTION + ": practical PCIe throughput"),
    ("runtime.sync_ns", ASSUMPTION + ": NRT wait/notification round trip"),
    # a metadata op changes sizes and strides on the host and launches nothing, so a real
    # device's host pays what the plain CPU's framework pays for it: the CPU's own `view`,
    # `reshape`, `t` under the profiler take 1.7-2.5 us (benchmarks/host_clock_table.py,
    # issue 14). The neuron runtime's own round trip around one is simulator time, cut exactly.
    ("runtime.metadata_ns", ASSUMPTION + ": the plain CPU's measured metadata op (1.7-2.5 us)"),
    # a real device's tensor is a plain C++ tensor: dropping its last reference returns its
    # block to the runtime's caching allocator on the host, about what the plain CPU's free
    # costs (0.47-0.85 us measured here for a 16-element tensor, profiler on or off; issue 14).
    # The neuron wrapper's own free (a Python subclass, its payload, the memory accounting's
    # weak reference) takes 2.4-5.2 us: simulator time, cut beyond this (runtime/guard.cpp).
    ("runtime.free_ns", ASSUMPTION + ": the plain CPU's measured tensor free (0.5-0.8 us)"),
)

TRN1 = DeviceSpec(
    name="trn1",
    chip="Trainium",
    core="NeuronCore-v2",
    cores_per_chip=2,
    tensor_engine_dim=128,
    # 190 BF16 TFLOPS per chip / 2 cores = 95 per core = 2*128*128*f  ->  f = 2.9 GHz.
    tensor_clock_hz=2.9e9,
    tensor_moving_fmax=512,
    tensor_instr_overhead_cycles=64,
    fp32_matmul_passes=4,  # 47.5 FP32 TFLOPS per chip vs 190 BF16
    fp8_speedup=1.0,  # trn1 lists FP8 at the BF16 rate
    vector=EngineSpec("VectorE", 1.4e9, 128, 128, 64, 8),
    scalar=EngineSpec("ScalarE", 1.4e9, 128, 128, 64),
    gpsimd=EngineSpec("GpSimdE", 1.4e9, 16, 16, 128),
    hbm_bytes=32 * _GIB,
    hbm_bytes_per_s_chip=820e9,
    dma_bytes_per_s=435.2e9,  # 16 DMA engines x 27.2 GB/s
    dma_queues=16,
    dma_latency_ns=1300,
    dma_min_efficient_bytes=4096,
    sbuf_bytes=24 * _MIB,
    psum_bytes=2 * _MIB,
    runtime=RuntimeSpec(
        launch_ns=4_000,
        eager_compile_ns=3_000_000,
        graph_compile_ns_base=2_000_000_000,
        graph_compile_ns_per_node=5_000_000,
        h2d_bytes_per_s=12e9,
        d2h_bytes_per_s=12e9,
        sync_ns=10_000,
        metadata_ns=2_000,
        free_ns=500,
    ),
    sources=(
        ("cores_per_chip", SRC_TRN1_NKI + ": 2 NeuronCores (v2) per device"),
        ("tensor_engine_dim", SRC_TRN1_NKI + ": 128x128 systolic array"),
        (
            "tensor_clock_hz",
            "derived: 190 BF16 TFLOPS per chip (" + SRC_TRN1_CHIP + ") / 2 / (2*128*128)",
        ),
        ("tensor_moving_fmax", SRC_NKI_ISA + ": nc_matmul moving free size up to 512"),
        ("tensor_instr_overhead_cycles", ASSUMPTION),
        ("fp32_matmul_passes", SRC_TRN1_CHIP + ": 47.5 FP32 vs 190 BF16 TFLOPS per chip"),
        ("fp8_speedup", SRC_TRN1_CHIP + ": FP8 at the BF16 rate"),
        (
            "vector",
            ASSUMPTION + ": 128 lanes at 1.4 GHz; " + SRC_TRN1_CORE + " gives only 2.3 FP32 TFLOPS",
        ),
        (
            "scalar",
            ASSUMPTION + ": 128 lanes at 1.4 GHz; " + SRC_TRN1_CORE + " gives only 2.9 FP32 TFLOPS",
        ),
        (
            "gpsimd",
            SRC_TRN1_CORE + ": 8 x 512-bit processors; rate for gather/scatter is an " + ASSUMPTION,
        ),
        ("hbm_bytes", SRC_TRN1_NKI + ": 32 GiB per device"),
        ("hbm_bytes_per_s_chip", SRC_TRN1_NKI + ": 820 GB/s per device"),
        ("dma_bytes_per_s", SRC_DMA_OVERVIEW + ": 16 DMA engines per core x 27.2 GB/s"),
        ("dma_queues", SRC_DMA_OVERVIEW + ": each NeuronCore (v2-v4) has 16 DMA engines"),
        (
            "dma_latency_ns",
            SRC_DMA_GUIDE + ": every DMA transfer pays descriptor setup, synchronization and "
            "semaphore-to-start latency, ~1300 ns cross-engine",
        ),
        ("dma_min_efficient_bytes", SRC_DMA_GUIDE + ": payloads >= 4 KiB to saturate HBM"),
        ("sbuf_bytes", SRC_TRN2_NKI + ": 24 MiB in NeuronCore-v2"),
        ("psum_bytes", SRC_TRN1_NKI + ": 2 MiB"),
        (
            "collectives.link_bytes_per_s",
            SRC_NCCOM + ": 52.83 GB/s bus bandwidth of a 2-rank fp32 all-reduce at 1 GiB",
        ),
        (
            "collectives.launch_ns",
            SRC_NCCOM + ": the 58 us floor of the 2-rank all-reduce less its two hops",
        ),
        (
            "collectives.ranks_per_node",
            SRC_NCCOM + ": 32 ranks on one trn1.32xlarge (16 chips x 2 NeuronCores)",
        ),
        (
            "collectives.efa_bytes_per_s",
            "trn1.32xlarge: 800 Gbps EFA over 16 chips (" + SRC_TRN1_CHIP + ")",
        ),
        ("logical_cores", lnc.physical_source("trn1")),
        *_CC_SOURCES,
        *_ENGINE_SOURCES,
        *_RUNTIME_SOURCES,
    ),
    collectives=CC_TRN1,
    policy=POLICY,
)

TRN2 = DeviceSpec(
    name="trn2",
    chip="Trainium2",
    core="NeuronCore-v3",
    cores_per_chip=8,
    tensor_engine_dim=128,
    tensor_clock_hz=2.4e9,  # 2*128*128*2.4e9 = 78.6 TFLOPS: the published 79 BF16 TFLOPS
    tensor_moving_fmax=512,
    tensor_instr_overhead_cycles=64,
    fp32_matmul_passes=4,  # 181 FP32 vs 667 BF16 TFLOPS per chip: ~4x (3.7x)
    fp8_speedup=2.0,  # 158 cFP8 vs 79 BF16 TFLOPS per core
    vector=EngineSpec("VectorE", 0.96e9, 512, 256, 64, 8),
    scalar=EngineSpec("ScalarE", 1.2e9, 128, 128, 64),
    gpsimd=EngineSpec("GpSimdE", 1.2e9, 16, 16, 128),
    hbm_bytes=96 * _GIB,
    hbm_bytes_per_s_chip=2.9e12,
    dma_bytes_per_s=368e9,
    dma_queues=16,  # 128 DMA engines per device / 8 cores
    dma_latency_ns=1300,
    dma_min_efficient_bytes=4096,
    sbuf_bytes=28 * _MIB,  # 128 partitions x 224 KiB
    psum_bytes=2 * _MIB,
    runtime=RuntimeSpec(
        launch_ns=4_000,
        eager_compile_ns=3_000_000,
        graph_compile_ns_base=2_000_000_000,
        graph_compile_ns_per_node=5_000_000,
        h2d_bytes_per_s=25e9,
        d2h_bytes_per_s=25e9,
        sync_ns=8_000,
        metadata_ns=2_000,
        free_ns=500,
    ),
    sources=(
        ("cores_per_chip", SRC_TRN2_NKI + ": 8 NeuronCores (v3) per device"),
        ("tensor_engine_dim", SRC_TRN2_NKI + ": 128-row data path (pmax 128)"),
        (
            "tensor_clock_hz",
            SRC_TRN2_NKI + ": Tensor engine 2.4 GHz; " + SRC_TRN2_CORE + ": 79 BF16 TFLOPS",
        ),
        ("tensor_moving_fmax", SRC_NKI_ISA + ": nc_matmul moving free size up to 512"),
        ("tensor_instr_overhead_cycles", ASSUMPTION),
        ("fp32_matmul_passes", SRC_TRN2_CHIP + ": 181 FP32 vs 667 BF16 TFLOPS per chip"),
        ("fp8_speedup", SRC_TRN2_CORE + ": 158 cFP8 vs 79 BF16 TFLOPS"),
        ("vector", SRC_TRN2_NKI + ": 0.96 GHz, 512 BF16/FP16 or 256 other elements per cycle"),
        ("scalar", SRC_TRN2_NKI + ": 1.2 GHz, 128 elements per cycle"),
        ("gpsimd", SRC_TRN2_NKI + ": 1.2 GHz; gather/scatter rate is an " + ASSUMPTION),
        ("hbm_bytes", SRC_TRN2_NKI + ": 96 GiB per device"),
        ("hbm_bytes_per_s_chip", SRC_TRN2_NKI + ": 2.9 TB/s per device"),
        (
            "dma_bytes_per_s",
            SRC_ISSUE
            + ": ~368 GB/s per core; "
            + SRC_DMA_OVERVIEW
            + " gives 16 engines x 27.2 GB/s = 435 GB/s theoretical",
        ),
        ("dma_queues", SRC_DMA_OVERVIEW + ": each NeuronCore (v2-v4) has 16 DMA engines"),
        (
            "dma_latency_ns",
            SRC_DMA_GUIDE + ": every DMA transfer pays descriptor setup, synchronization and "
            "semaphore-to-start latency, ~1300 ns cross-engine",
        ),
        ("dma_min_efficient_bytes", SRC_DMA_GUIDE + ": payloads >= 4 KiB to saturate HBM"),
        ("sbuf_bytes", SRC_TRN2_NKI + ": 28 MiB (128 partitions of 224 KiB)"),
        ("psum_bytes", SRC_TRN2_NKI + ": 2 MiB"),
        ("collectives.link_bytes_per_s", SRC_TRN2_CHIP + ": NeuronLink-v3, 1.28 TB/s per chip"),
        (
            "collectives.efa_bytes_per_s",
            "trn2.48xlarge: 3.2 Tbps EFAv3 over 16 chips (" + SRC_TRN2_CHIP + ")",
        ),
        ("collectives.launch_ns", ASSUMPTION + ": 0 (no published floor; trn1's not carried over)"),
        (
            "collectives.ranks_per_node",
            SRC_CC_INTRANODE + ": 16 chips x 4 ranks (LNC=2) on one instance",
        ),
        ("logical_cores", lnc.physical_source("trn2")),
        *_CC_SOURCES,
        *_ENGINE_SOURCES,
        *_RUNTIME_SOURCES,
    ),
    collectives=CC_TRN2,
    policy=POLICY,
)

TRN3 = DeviceSpec(
    name="trn3",
    chip="Trainium3",
    core="NeuronCore-v4",
    cores_per_chip=8,
    tensor_engine_dim=128,
    # 671 BF16 TFLOPS per chip / 8 cores = 83.9 per core = 2*128*128*f  ->  f = 2.56 GHz.
    tensor_clock_hz=2.56e9,
    tensor_moving_fmax=512,
    tensor_instr_overhead_cycles=64,
    fp32_matmul_passes=4,  # 183 FP32 vs 671 BF16 TFLOPS per chip
    fp8_speedup=3.75,  # 2517 MXFP8 vs 671 BF16 TFLOPS per chip
    vector=EngineSpec("VectorE", 0.96e9, 512, 256, 64, 8),
    scalar=EngineSpec("ScalarE", 1.2e9, 128, 128, 64),
    gpsimd=EngineSpec("GpSimdE", 1.2e9, 16, 16, 128),
    hbm_bytes=144 * _GIB,
    hbm_bytes_per_s_chip=4.9e12,
    dma_bytes_per_s=614.4e9,  # 16 DMA engines x 38.4 GB/s
    dma_queues=16,
    dma_latency_ns=1300,
    dma_min_efficient_bytes=4096,
    sbuf_bytes=32 * _MIB,
    psum_bytes=2 * _MIB,
    runtime=RuntimeSpec(
        launch_ns=4_000,
        eager_compile_ns=3_000_000,
        graph_compile_ns_base=2_000_000_000,
        graph_compile_ns_per_node=5_000_000,
        h2d_bytes_per_s=25e9,
        d2h_bytes_per_s=25e9,
        sync_ns=8_000,
        metadata_ns=2_000,
        free_ns=500,
    ),
    sources=(
        ("cores_per_chip", SRC_TRN3_CHIP + ": 8 NeuronCore-v4 per chip"),
        ("tensor_engine_dim", SRC_TRN3_NKI + ": 128-partition tiles as in v3"),
        (
            "tensor_clock_hz",
            "derived: 671 BF16 TFLOPS per chip (" + SRC_TRN3_CHIP + ") / 8 / (2*128*128)",
        ),
        ("tensor_moving_fmax", SRC_NKI_ISA + ": nc_matmul moving free size up to 512"),
        ("tensor_instr_overhead_cycles", ASSUMPTION),
        ("fp32_matmul_passes", SRC_TRN3_CHIP + ": 183 FP32 vs 671 BF16 TFLOPS per chip"),
        ("fp8_speedup", SRC_TRN3_CHIP + ": 2,517 MXFP8 vs 671 BF16 TFLOPS per chip"),
        ("vector", ASSUMPTION + ": as NeuronCore-v3"),
        ("scalar", ASSUMPTION + ": as NeuronCore-v3"),
        ("gpsimd", ASSUMPTION + ": as NeuronCore-v3"),
        ("hbm_bytes", SRC_TRN3_CHIP + ": 144 GiB per chip"),
        ("hbm_bytes_per_s_chip", SRC_TRN3_CHIP + ": 4.9 TB/s (the NKI guide says 4.7)"),
        ("dma_bytes_per_s", SRC_DMA_OVERVIEW + ": 16 engines x 38.4 GB/s (chip: 4.9 TB/s / 8)"),
        ("dma_queues", SRC_DMA_OVERVIEW + ": each NeuronCore (v2-v4) has 16 DMA engines"),
        (
            "dma_latency_ns",
            SRC_DMA_GUIDE + ": every DMA transfer pays descriptor setup, synchronization and "
            "semaphore-to-start latency, ~1300 ns cross-engine",
        ),
        ("dma_min_efficient_bytes", SRC_DMA_GUIDE + ": payloads >= 4 KiB to saturate HBM"),
        ("sbuf_bytes", SRC_TRN3_CORE + ": 32 MiB"),
        ("psum_bytes", SRC_TRN3_NKI + ": 2 MiB, as in v3"),
        ("collectives.link_bytes_per_s", SRC_TRN3_CHIP + ": NeuronLink-v4, 2.56 TB/s per device"),
        ("collectives.efa_bytes_per_s", ASSUMPTION + ": as trn2 (3.2 Tbps per 16 chips)"),
        ("collectives.launch_ns", ASSUMPTION + ": 0 (no published floor; trn1's not carried over)"),
        ("collectives.ranks_per_node", ASSUMPTION + ": as trn2, 16 chips x 4 ranks (LNC=2)"),
        ("logical_cores", lnc.physical_source("trn3")),
        *_CC_SOURCES,
        *_ENGINE_SOURCES,
        *_RUNTIME_SOURCES,
    ),
    collectives=CC_TRN3,
    policy=POLICY,
)

SPECS: dict[str, DeviceSpec] = {s.name: s for s in (TRN1, TRN2, TRN3)}  # physical cores
# the logical cores of two physical ones (NEURON_LOGICAL_NC_CONFIG=2, the SDK's default on trn2
# and trn3: lnc.SRC_EVRF066), "trn2-lnc2" and "trn3-lnc2": one core's engines, the pair's DMA,
# HBM bank, SBUF and PSUM (lnc.SRC_LNC, lnc.SRC_NKI_LNC); trn1 has none (lnc.SRC_EARG001)
LOGICAL: dict[str, DeviceSpec] = {
    s.name: s for s in (lnc.logical_spec(SPECS[c], 2) for c in SPECS if 2 in lnc.DEGREES[c])
}
_default: str | None = None


def _lookup(name: str) -> DeviceSpec:
    chip, degree = lnc.physical_name(name.strip().lower())
    if chip not in SPECS:
        raise ValueError(f"unknown neuron device spec {name!r} (known: {', '.join(SPECS)})")
    return _of(chip, degree)


def _of(chip: str, degree: int) -> DeviceSpec:
    if degree == 1:
        return SPECS[chip]
    return LOGICAL.get(f"{chip}{lnc.SUFFIX}{degree}") or lnc.logical_spec(SPECS[chip], degree)


def set_default_spec(name: str | None) -> DeviceSpec | None:
    """Make `name` (trn1, trn2, trn3, or trn2-lnc2, trn3-lnc2) the spec get_spec() returns;
    None goes back to the env var."""
    global _default
    if name is None:
        _default = None
        return None
    spec = _lookup(name)
    _default = spec.name
    return spec


def get_spec(name: str | None = None) -> DeviceSpec:
    """The named spec, else the one set by set_default_spec, else $NEURON_DEVICE_SPEC, else trn2;
    without a name, $NEURON_LOGICAL_NC_CONFIG (1 or 2) sets its logical core's size when set."""
    if name is not None:
        return _lookup(name)
    spec = _lookup(_default or os.environ.get(ENV_VAR) or DEFAULT_SPEC)
    degree = lnc.degree_from_env()
    return spec if degree is None else _of(lnc.physical_name(spec.name)[0], degree)

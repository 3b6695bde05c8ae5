"""The shape of a modeled NeuronCore's hardware figures: frozen dataclasses, read by attribute.

The VALUES (trn1, trn2, trn3) and the public source of each figure live in
backend/costmodel/spec.py; a profile's manifest keeps a spec as JSON (`DeviceSpec.to_dict()`),
and analysis reads it back as `SpecFigures` (the figures it uses, any of them possibly absent).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EngineSpec:
    """A NeuronCore compute engine: clock, elements per cycle per dtype width, fixed cost."""

    name: str
    clock_hz: float
    elems_per_cycle_16bit: int  # bf16/fp16 elements processed per cycle
    elems_per_cycle_32bit: int  # fp32 (and wider) elements per cycle
    instr_overhead_cycles: int  # fixed issue/drain cost of one instruction
    reciprocal_cost: int = 1  # a reciprocal costs this many one-input passes on the engine


@dataclass(frozen=True)
class RuntimeSpec:
    """Host-side runtime costs the backend charges to the host clock (all modeled)."""

    launch_ns: int  # submit one kernel to the device queue
    eager_compile_ns: int  # first use of an (op, shapes, dtypes) key in eager mode
    graph_compile_ns_base: int  # torch.compile: fixed cost of compiling one graph
    graph_compile_ns_per_node: int  # ... plus this per FX node
    h2d_bytes_per_s: float  # host-to-device copy bandwidth (PCIe)
    d2h_bytes_per_s: float  # device-to-host copy bandwidth (PCIe)
    sync_ns: int  # fixed cost of a host wait on the device, on top of the wait itself
    metadata_ns: int  # host cost of a metadata op (view, reshape, t): no device work at all
    free_ns: int  # host cost of freeing one tensor (its last reference dropped)


@dataclass(frozen=True)
class CollectiveSpec:
    """Links the collectives run over and the algorithms the runtime picks by message size
    (a rank is a NeuronCore; the link figures are what one rank sees)."""

    link_bytes_per_s: float  # NeuronLink, per chip, all its links together
    efa_bytes_per_s: float  # EFA between instances, the instance's bandwidth per chip
    chips_per_node: int  # chips one NeuronLink domain (an instance) holds
    step_latency_ns: int  # fixed cost of one ring or tree step (a hop's handshake)
    launch_ns: int = 0  # fixed cost of one collective (its launch and the CC cores' sync)
    ranks_per_node: int = 0  # ranks (NeuronCores) one instance holds; 0: one per chip
    # within an instance, a buffer under mesh_max_bytes runs the mesh algorithm (O(1) hops),
    # one under rdh_max_bytes recursive doubling-halving (O(log n)); past both, the ring (O(n))
    mesh_max_bytes: int = 0
    rdh_max_bytes: int = 0


@dataclass(frozen=True)
class ModelPolicy:
    """How the modeled compiler tiles and pipelines work: model choices, not chip facts."""

    max_stages: int  # a kernel's work is split into at most this many pipelined stages
    stage_min_bytes: int  # ... each moving at least this much HBM traffic
    dma_piece_min_bytes: int  # a stage's tensor is spread over queues in pieces >= this
    engine_tile_elems: int  # elements one Vector/Scalar/GpSimd instruction handles
    sbuf_operand_share: float  # share of SBUF a matmul keeps its operands in
    # share of SBUF a compiled graph (one NEFF) keeps live intermediates in; the rest holds the
    # operands being streamed. Past it an intermediate is spilled to HBM
    sbuf_resident_share: float = 0.5
    # a NEFF's loop of Vector/Scalar work (a group without matmuls) is pipelined this finely:
    # the compiler's own loops run hundreds of tiles, and engines that alternate along a chain
    # overlap only across stages
    loop_max_stages: int = 32


@dataclass(frozen=True)
class DeviceSpec:
    """One NeuronCore of a Trainium chip (a logical one of `logical_cores` physical cores);
    `sources` names the public origin of each figure."""

    name: str
    chip: str
    core: str
    cores_per_chip: int
    tensor_engine_dim: int  # systolic array is dim x dim
    tensor_clock_hz: float
    tensor_moving_fmax: int  # columns of the moving tensor one matmul instruction streams
    tensor_instr_overhead_cycles: int
    fp32_matmul_passes: int  # an fp32 matmul takes this many passes of a bf16 one
    fp8_speedup: float  # fp8 matmul throughput relative to bf16
    vector: EngineSpec
    scalar: EngineSpec
    gpsimd: EngineSpec
    hbm_bytes: int  # device memory per chip
    hbm_bytes_per_s_chip: float
    dma_bytes_per_s: float  # per core, all DMA queues of the core together
    dma_queues: int  # DMA queues (rings) one core drives in parallel
    dma_latency_ns: int  # fixed start cost of one DMA transfer
    dma_min_efficient_bytes: int  # below this a transfer runs at reduced bandwidth
    sbuf_bytes: int
    psum_bytes: int
    runtime: RuntimeSpec
    collectives: CollectiveSpec
    policy: ModelPolicy
    sources: tuple[tuple[str, str], ...] = ()  # (field, public source or ASSUMPTION)
    # physical NeuronCores one modeled core holds (the Neuron SDK's logical NeuronCore config,
    # LNC): at 2, cores_per_chip counts logical cores and the DMA, SBUF and PSUM figures are
    # the pair's; the engines stay one physical core's, and lowering splits work over the pair
    logical_cores: int = 1

    @property
    def clock_hz(self) -> float:
        """The TensorE clock, the one that sets the peak FLOPS."""
        return self.tensor_clock_hz

    @property
    def peak_flops_bf16(self) -> float:
        """dim x dim multiply-accumulates per cycle, two flops each, on each physical core."""
        return 2.0 * self.tensor_engine_dim**2 * self.tensor_clock_hz * self.logical_cores

    @property
    def peak_flops_fp32(self) -> float:
        return self.peak_flops_bf16 / self.fp32_matmul_passes

    @property
    def hbm_bytes_per_s(self) -> float:
        """One core's share of the chip's HBM bandwidth."""
        return self.hbm_bytes_per_s_chip / self.cores_per_chip

    @property
    def memory_bytes_per_s(self) -> float:
        """What one core can stream from HBM: the lower of its DMA and its HBM share."""
        return min(self.dma_bytes_per_s, self.hbm_bytes_per_s)

    @property
    def hbm_source(self) -> str | None:
        """Where the chip's HBM capacity comes from (its entry in `sources`)."""
        return dict(self.sources).get("hbm_bytes")

    @property
    def machine_balance(self) -> float:
        """Flops per byte at the roofline ridge (bf16 peak over memory bandwidth)."""
        return self.peak_flops_bf16 / self.memory_bytes_per_s

    @property
    def machine_balance_fp32(self) -> float:
        return self.peak_flops_fp32 / self.memory_bytes_per_s

    def to_dict(self) -> dict:
        """JSON-serialisable form for a profile manifest's `device_spec`."""
        out = asdict(self)
        out["sources"] = dict(self.sources)
        for name in (
            "clock_hz",
            "peak_flops_bf16",
            "peak_flops_fp32",
            "hbm_bytes_per_s",
            "memory_bytes_per_s",
            "machine_balance",
            "machine_balance_fp32",
        ):
            out[name] = getattr(self, name)
        return out


_COUNTS = ("dma_min_efficient_bytes", "tensor_engine_dim", "hbm_bytes")  # the integer figures


@dataclass(frozen=True)
class SpecFigures:
    """What analysis reads of a profile's device spec: a DeviceSpec.to_dict() in a capture's
    manifest, or any part of one (a hand-made or older profile); a missing figure is None."""

    name: str | None = None
    peak_flops_bf16: float | None = None
    peak_flops_fp32: float | None = None
    hbm_bytes_per_s: float | None = None  # one core's share of the chip's HBM bandwidth
    dma_bytes_per_s: float | None = None
    memory_bytes_per_s: float | None = None  # the lower of DMA and the HBM share
    machine_balance: float | None = None  # flops per byte at the roofline ridge (bf16)
    dma_min_efficient_bytes: int | None = None
    tensor_engine_dim: int | None = None
    hbm_bytes: int | None = None  # device memory of one chip
    hbm_source: str | None = None  # where that figure comes from (the spec's sources)

    @classmethod
    def from_dict(cls, spec: dict[str, Any] | None) -> SpecFigures:
        """The figures of a manifest's `device_spec` (all None without one); a figure that is not
        a positive number reads as None. `peak_flops` stands for peak_flops_bf16 when alone."""
        spec = spec or {}
        num = {k: v for k, v in spec.items() if isinstance(v, (int, float)) and v > 0}
        if "peak_flops_bf16" not in num and "peak_flops" in num:
            num["peak_flops_bf16"] = num["peak_flops"]
        name = spec.get("name")
        values: dict[str, Any] = {"name": str(name) if name is not None else None}
        sources = spec.get("sources")
        if isinstance(sources, dict) and isinstance(sources.get("hbm_bytes"), str):
            values["hbm_source"] = sources["hbm_bytes"]
        for f in fields(cls):
            if f.name in num:
                values[f.name] = int(num[f.name]) if f.name in _COUNTS else float(num[f.name])
        return cls(**values)

"""Lower an op (name + tensor shapes) to a NeuronCore kernel plan; fuse plans into one kernel.

A kernel is a software pipeline: its HBM inputs are loaded by DMA into SBUF in stages, engines
compute on each stage while the next one loads, and results are stored back by DMA.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import ceil

from neuron_explorer.vocab.engines import TENSOR_ENGINE

from . import custom, ops
from .plan import DMA, Compute, Instr, KernelPlan, TensorInfo
from .spec import DeviceSpec, EngineSpec, get_spec

_CACHE: dict[tuple, KernelPlan] = {}
_CACHE_MAX = 1 << 16


def lower_op(
    op: str,
    inputs: Sequence[TensorInfo] = (),
    outputs: Sequence[TensorInfo] = (),
    spec: DeviceSpec | None = None,
    name: str | None = None,
) -> KernelPlan:
    """The kernel plan of one op; never raises for an unknown op (it falls back by category)."""
    spec = spec or get_spec()
    inputs = tuple(inputs)
    outputs = tuple(outputs)
    key = (op, inputs, outputs, spec.name, name)
    plan = _CACHE.get(key)
    if plan is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        plan = _CACHE[key] = _lower(op, inputs, outputs, spec, name or ops.base_name(op))
    return plan


def _lower(op, inputs, outputs, spec, name) -> KernelPlan:
    kernel = custom.declared(op)
    if kernel is not None:
        return _lower_declared(op, kernel, inputs, outputs, spec, name)
    category = ops.classify(op)
    if ops.is_multi_tensor(op) and inputs:
        return _lower_multi(op, category, inputs, outputs, spec, name)
    if not outputs and inputs:
        outputs = inputs[:1]  # an in-place op writes its first argument
    if category == ops.VIEW:
        return KernelPlan(name, op, (), 0, 0, 0, inputs, outputs, (), category, spec.name)
    if category == ops.MATMUL:
        try:
            return _lower_matmul(op, inputs, outputs, spec, name)
        except (ValueError, IndexError, ZeroDivisionError, StopIteration):
            category = ops.ELEMENTWISE  # shapes we cannot read as a GEMM
    if category == ops.COPY:
        if inputs and outputs and inputs[-1].dtype != outputs[0].dtype:
            category = ops.ELEMENTWISE  # a dtype conversion runs on VectorE
        else:
            moved = [sum(t.nbytes for t in outputs)]
            return assemble(spec, name, op, category, inputs, outputs, moved, (), moved)
    computes = _engine_work(op, category, inputs, outputs, spec)
    reads = [t.nbytes for t in inputs]
    if category == ops.FILL:
        reads = []
    elif category == ops.GATHER and inputs and ops.reads_gathered_rows(op):
        # a gather reads the rows it fetches, not the whole source table
        reads = reads[1:] + [sum(t.nbytes for t in outputs)]
    writes = [t.nbytes for t in outputs]
    return assemble(spec, name, op, category, inputs, outputs, reads, computes, writes)


def _lower_declared(op, kernel, inputs, outputs, spec, name) -> KernelPlan:
    """A user's declared kernel (costmodel/custom.py): its reads, one pass of its FLOPs on its
    engine, its writes; on TensorE, its GEMMs tiled as the device's own matmuls are."""
    if kernel.engine == TENSOR_ENGINE:
        try:
            problems = custom.gemms_of(kernel, inputs, spec.tensor_engine_dim)
        except (ValueError, IndexError, TypeError, ZeroDivisionError):
            # shapes its declaration cannot read as GEMMs (a library's op of another
            # signature): one VectorE pass over its output, as an aten matmul's would be
            passes = _engine_work(op, ops.ELEMENTWISE, inputs, outputs, spec)
            moved = ([t.nbytes for t in inputs], [t.nbytes for t in outputs])
            return assemble(spec, name, op, ops.CUSTOM, inputs, outputs, moved[0], passes, moved[1])
        declared = None if kernel.bytes_read is None else custom.reads_of(kernel, inputs)
        return _lower_matmul(op, inputs, outputs, spec, name, problems, ops.CUSTOM, declared)
    engine = {"VectorE": spec.vector, "ScalarE": spec.scalar, "GpSimdE": spec.gpsimd}
    flops, reads = custom.work_of(kernel, inputs)
    work = _pass(spec, engine[kernel.engine], "custom", flops, _itemsize(inputs + outputs))
    writes = [t.nbytes for t in outputs]
    return assemble(spec, name, op, ops.CUSTOM, inputs, outputs, reads, (work,), writes)


def _lower_multi(op, category, inputs, outputs, spec, name) -> KernelPlan:
    """One kernel over every tensor of the lists: the work is the sum over the first list."""
    first = ops.first_list(op, inputs)
    passes, lists_written = ops.multi_tensor_passes(op)
    if not outputs:  # in place: the first list (and an optimizer's state lists) are written
        outputs = inputs[: len(first) * lists_written]
    elems = sum(t.numel for t in first)
    eng, opcode = (spec.vector, "tensor_tensor")
    if category == ops.TRANSCENDENTAL:
        eng, opcode = (spec.scalar, "activation")
    work = _pass(spec, eng, opcode, elems * passes, _itemsize(first))
    reads = [t.nbytes for t in inputs]
    writes = [t.nbytes for t in outputs]
    return assemble(spec, name, op, category, inputs, outputs, reads, (work,), writes)


def _elems(ts: Sequence[TensorInfo]) -> int:
    return max((t.numel for t in ts), default=1)


def _itemsize(ts: Sequence[TensorInfo]) -> int:
    return max((t.itemsize for t in ts), default=4)


def _pass(
    spec: DeviceSpec,
    eng: EngineSpec,
    opcode: str,
    elems: int,
    itemsize: int,
    flops_per_elem=1,
    cost: int = 1,
) -> Compute:
    """One pass of an engine over `elems` elements, tiled into instructions of the policy size
    (`cost` cycles per element where the instruction is that many times slower). On a logical
    core the elements are split over its physical cores' engines, each paying its own
    instructions' overhead, unless a core would get less than a row of the partitions."""
    rate = eng.elems_per_cycle_16bit if itemsize <= 2 else eng.elems_per_cycle_32bit
    lanes = spec.tensor_engine_dim  # engines work across the 128 SBUF partitions
    cores = spec.logical_cores if elems >= spec.logical_cores * lanes else 1
    per_core = ceil(elems / cores)
    count = max(1, ceil(per_core / spec.policy.engine_tile_elems))
    cycles = ceil(per_core * cost / rate) + count * eng.instr_overhead_cycles
    return Compute(
        eng.name,
        opcode,
        cycles * 1e9 / eng.clock_hz,
        int(elems * flops_per_elem),
        count * cores,
        min(1.0, elems / lanes),
        elems * itemsize,
    )


def _engine_work(op, category, inputs, outputs, spec) -> tuple[Compute, ...]:
    out_elems = _elems(outputs)
    in_elems = _elems(inputs)
    size = _itemsize(inputs + outputs)
    vec, sca, gp = spec.vector, spec.scalar, spec.gpsimd
    backward = "backward" in op
    if category == ops.TRANSCENDENTAL:
        return (_pass(spec, sca, "activation", out_elems, size),)
    if category == ops.GATHER:
        scatter = any(w in op for w in ("scatter", "put", "index_add", "index_copy"))
        elems = max((t.numel for t in inputs[1:]), default=out_elems) if scatter else out_elems
        return (_pass(spec, gp, "local_scatter" if scatter else "local_gather", elems, size),)
    if category == ops.REDUCTION:
        two_pass = any(w in op for w in ("var", "std", "norm"))
        opcode = "bn_stats" if two_pass else "tensor_reduce"
        return (_pass(spec, vec, opcode, in_elems, size, 2 if two_pass else 1),)
    if category == ops.NORM:
        work = [_pass(spec, vec, "bn_stats", in_elems, size, 3),
                _pass(spec, sca, "activation", in_elems, size, 2)]  # fmt: skip
        if backward:
            work += [_pass(spec, vec, "tensor_tensor", in_elems, size, 3),
                     _pass(spec, vec, "tensor_reduce", in_elems, size)]  # fmt: skip
        return tuple(work)
    if category == ops.SOFTMAX:
        if backward:
            return (_pass(spec, vec, "tensor_tensor", in_elems, size, 2),
                    _pass(spec, vec, "tensor_scalar", in_elems, size, 2))  # fmt: skip
        return (_pass(spec, vec, "tensor_reduce", in_elems, size),
                _pass(spec, sca, "activation_reduce", in_elems, size, 2),
                _pass(spec, vec, "tensor_scalar", in_elems, size))  # fmt: skip
    if category == ops.FILL:
        random = any(w in op for w in ("rand", "normal", "uniform", "bernoulli", "random"))
        if random or "arange" in op or "iota" in op:
            return (_pass(spec, gp, "iota" if not random else "rng", out_elems, size),)
        return (_pass(spec, vec, "memset", out_elems, size, 0),)
    opcode = "tensor_tensor" if sum(t.numel > 1 for t in inputs) >= 2 else "tensor_scalar"
    if category == ops.COPY:
        opcode = "tensor_copy"
    one = _pass(spec, vec, opcode, max(out_elems, 1), size)
    if opcode == "tensor_tensor" and ops.base_name(op) in ("div", "true_divide", "divide"):
        # VectorE divides by a tensor as a reciprocal, then a multiply (the NKI neuronx-cc
        # emits for x / y: nisa.reciprocal, nl.multiply); VectorE's reciprocal is the precise
        # one, `reciprocal_cost` times slower than a one-input pass (nki.isa.reciprocal: 8N)
        recip = _pass(spec, vec, "reciprocal", max(out_elems, 1), size, 1, vec.reciprocal_cost)
        return (recip, one)
    return (one,)


def _core_share(spec: DeviceSpec, batch: int, units: int, smaller: int) -> tuple[float, int]:
    """The share of a GEMM's TensorE time one physical core of a logical core runs, and the HBM
    bytes the split adds. Its work splits by batch, else by its units (a 128-row block of M
    times a column chunk of N), each core taking whole ones; a GEMM of one unit runs on one
    core. Split by units, both cores read the smaller operand whole (the other's own part)."""
    cores = spec.logical_cores
    if cores == 1 or batch * units < 2:
        return 1.0, 0
    if batch >= cores:
        return ceil(batch / cores) / batch, 0
    return ceil(units / cores) / units, (cores - 1) * smaller


def _split(extent: int, dim: int) -> list[tuple[int, int]]:
    """(tile size, tile count) pairs covering `extent` with tiles of at most `dim`."""
    full, rest = divmod(extent, dim)
    return [(s, c) for s, c in ((dim, full), (rest, 1)) if c and s]


def lhs_index(op: str) -> int:
    """Which tensor argument of a matmul op is A of A @ B: the first, after the added tensor
    of addmm and its kin."""
    return 1 if ops.base_name(op) in ("addmm", "baddbmm", "addbmm", "_addmm_activation") else 0


def _lower_matmul(
    op, inputs, outputs, spec: DeviceSpec, name, problems=None, category=ops.MATMUL, reads=None
) -> KernelPlan:
    """TensorE tiles: stationary K x M (<= 128 x 128), moving columns streamed <= 512 at a time.

    `problems` are the GEMMs (batch, M, K, N), by default the op's own (ops.gemms); `reads`
    the HBM reads, by default its inputs and any re-reads of operands SBUF cannot hold."""
    declared = problems is not None
    if problems is None:
        problems = ops.gemms(op, inputs, outputs)
    dtype = next((t.dtype for t in inputs if len(t.shape) >= 1), "float32")
    size = TensorInfo((), dtype).itemsize
    if "float8" in dtype:
        passes = 1.0 / spec.fp8_speedup
    elif size <= 2:
        passes = 1.0
    else:
        passes = float(spec.fp32_matmul_passes)
    dim, fmax = spec.tensor_engine_dim, spec.tensor_moving_fmax
    groups: dict[tuple[int, int], list[float]] = {}  # (k, m) tile -> [count, cycles, flops]
    reread = 0
    # each physical core of a logical one blocks its part of the GEMM in its own SBUF
    budget = spec.sbuf_bytes / spec.logical_cores * spec.policy.sbuf_operand_share
    overhead = max(1.0, passes) * spec.tensor_instr_overhead_cycles
    attention = not declared and ("attention" in op or "scaled_dot_product" in op)
    plain = not attention and (declared or "conv" not in op)
    first = lhs_index(op)
    if len(inputs) > first and inputs[first].transposed:  # A is K-major: nothing to transpose
        plain = False
    transposes = [0, 0.0, 0]  # instructions, TensorE cycles, elements copied out of PSUM
    for b, m, k, n in problems:
        n_chunks = ceil(n / fmax)
        # an fp32 matmul is `passes` bf16-rate passes, each paying the instruction overhead
        col_cycles = n * passes + n_chunks * overhead
        a_bytes, b_bytes = b * m * k * size, b * k * n * size
        share, dup = _core_share(spec, b, ceil(m / dim) * n_chunks, min(a_bytes, b_bytes))
        reread += dup
        for ks, kc in _split(k, dim):
            for ms, mc in _split(m, dim):
                g = groups.setdefault((ks, ms), [0, 0.0, 0])
                tiles = b * kc * mc
                g[0] += tiles * n_chunks
                g[1] += tiles * col_cycles * share
                g[2] += 2 * b * kc * ks * mc * ms * n
        if not plain:
            if a_bytes + b_bytes > budget:  # operands do not fit SBUF: stream B per A block
                reread += (ceil(a_bytes / budget) - 1) * b_bytes
            continue
        # neuronx-cc's loop for A @ B (the NKI it emits, NKIBench's baseline matmul): B stays in
        # SBUF one column block at a time, as wide as the operand share holds, and for each
        # block A is streamed again and each of its 128x128 tiles transposed on TensorE (K must
        # lie on the partitions) and copied out of PSUM by VectorE
        width = max(fmax, int(budget // (k * size * fmax)) * fmax)
        blocks = b * ceil(n / width)
        tiles = blocks * ceil(m / dim) * ceil(k / dim)
        transposes[0] += tiles
        transposes[1] += tiles * (dim * passes + overhead) * share
        transposes[2] += blocks * m * k
        reread += (ceil(n / width) - 1) * a_bytes
    computes = []
    for (ks, ms), (count, cycles, flops) in sorted(
        groups.items(), key=lambda kv: -kv[0][0] * kv[0][1]
    ):
        util = ks * ms / (dim * dim)
        computes.append(Compute(TENSOR_ENGINE, "nc_matmul", cycles * 1e9 / spec.tensor_clock_hz,
                                int(flops), int(count), util, 0))  # fmt: skip
    if transposes[0]:  # before the products that read them
        computes[:0] = [
            Compute(TENSOR_ENGINE, "nc_transpose", transposes[1] * 1e9 / spec.tensor_clock_hz, 0,
                    int(transposes[0]), 1.0, 0),
            _pass(spec, spec.vector, "tensor_copy", int(transposes[2]), 4, 0),
        ]  # fmt: skip
    out_elems = sum(b * m * n for b, m, _, n in problems)
    # PSUM holds fp32 partial sums; VectorE moves them to SBUF (and casts) before the store.
    computes.append(_pass(spec, spec.vector, "tensor_copy", out_elems, 4, 0))
    if attention:
        # one flash-attention kernel (NKI-lib's): the scores never leave SBUF/PSUM; ScalarE
        # exponentiates them with the running row max and sum (forward, and again in backward)
        scores = problems[0][0] * problems[0][1] * problems[0][3]
        computes.insert(1, _pass(spec, spec.scalar, "activation_reduce", scores, 4, 2))
        if "backward" in op:  # dS = P * (dP - rowsum(dO * O)) on VectorE
            computes.insert(2, _pass(spec, spec.vector, "tensor_tensor", scores, 4, 2))
        if name == ops.base_name(op):
            name = "flash_attention_backward" if "backward" in op else "flash_attention"
    if reads is None:
        reads = [t.nbytes for t in inputs] + ([reread] if reread else [])
    writes = [t.nbytes for t in outputs]
    return assemble(
        spec, name, op, category, inputs, outputs, reads, computes, writes, tuple(problems)
    )


def assemble(
    spec: DeviceSpec,
    name: str,
    op: str,
    category: str,
    inputs: tuple[TensorInfo, ...],
    outputs: tuple[TensorInfo, ...],
    reads: Sequence[int],
    computes: Sequence[Compute],
    writes: Sequence[int],
    gemms: tuple[tuple[int, int, int, int], ...] = (),
    max_stages: int | None = None,
) -> KernelPlan:
    """Pipeline `reads` -> `computes` -> `writes` in stages, loading stage s+1 during stage s
    (at most `max_stages`, the policy's by default)."""
    policy = spec.policy
    reads = [r for r in reads if r > 0]
    writes = [w for w in writes if w > 0]
    total = sum(reads) + sum(writes)
    stages = max(1, min(max_stages or policy.max_stages, total // policy.stage_min_bytes))
    if computes:
        stages = min(stages, max(1, min(c.repeat for c in computes)))
    nq = spec.dma_queues
    queue_bw = spec.memory_bytes_per_s / nq / 1e9  # bytes per ns per queue
    instrs: list[Instr] = []
    next_queue = [0]

    def transfer_ns(piece: int) -> int:
        eff = min(1.0, piece / spec.dma_min_efficient_bytes)  # small payloads waste bandwidth
        return max(1, round(spec.dma_latency_ns + piece / (queue_bw * eff)))

    def dma(nbytes: int, opcode: str, deps: tuple[int, ...], read: bool, write: bool) -> list[int]:
        if nbytes <= 0:
            return []
        pieces = max(1, min(nq, ceil(nbytes / policy.dma_piece_min_bytes)))
        base, extra = divmod(nbytes, pieces)
        first, q0 = len(instrs), next_queue[0]
        # `extra` pieces carry one byte more; one duration for all is exact to the nanosecond
        dur = transfer_ns(base + (extra > 0))
        big, small = base + 1, base
        instrs.extend(
            Instr(DMA, opcode, dur, deps, 0, (big if i < extra else small) if read else 0,
                  (big if i < extra else small) if write else 0, (q0 + i) % nq)
            for i in range(pieces)
        )  # fmt: skip
        next_queue[0] = (q0 + pieces) % nq
        return list(range(first, first + pieces))

    def part(total_value: int, s: int) -> int:
        share = total_value // stages
        return share + (total_value - share * stages if s == stages - 1 else 0)

    if not computes:  # pure data movement, HBM -> HBM: nothing to overlap, so one stage
        for w in writes:
            dma(w, "dma_hbm_to_hbm", (), True, True)
        return _plan(
            name, op, instrs, 0, sum(writes), sum(writes), inputs, outputs, (), category, spec
        )

    loads: list[list[int]] = []

    def load(s: int) -> None:
        loads.append(
            [i for r in reads for i in dma(part(r, s), "dma_hbm_to_sbuf", (), True, False)]
        )

    load(0)
    # software pipelining: engine streams interleave the stages along a wavefront (step t runs
    # work k of stage t - k), so a stage's early work on one engine does not queue behind the
    # previous stage's late work there, as a compiler's modulo schedule orders it
    n = len(computes)
    deps_of: list[tuple[int, ...]] = [()] * stages
    for t in range(stages + n - 1):
        for s in range(max(0, t - n + 1), min(stages, t + 1)):
            k = t - s
            if k == 0:
                if s + 1 < stages:
                    load(s + 1)
                deps_of[s] = tuple(loads[s])
            c = computes[k]
            instrs.append(Instr(c.engine, c.opcode, max(1, round(c.dur_ns / stages)), deps_of[s],
                                part(c.flops, s), part(c.sbuf_bytes, s), 0, 0,
                                max(1, part(c.repeat, s)), c.utilization))  # fmt: skip
            deps_of[s] = (len(instrs) - 1,)
            if k == n - 1:
                for w in writes:
                    dma(part(w, s), "dma_sbuf_to_hbm", deps_of[s], False, True)
    flops = sum(c.flops for c in computes)
    return _plan(name, op, instrs, flops, sum(reads), sum(writes), inputs, outputs, tuple(computes),
                 category, spec, gemms)  # fmt: skip


def _plan(
    name, op, instrs, flops, read, written, inputs, outputs, computes, category, spec, gemms=()
):
    return KernelPlan(name, op, tuple(instrs), flops, read, written, inputs, outputs, computes,
                      category, spec.name, tuple(gemms))  # fmt: skip


def fuse(
    plans: Sequence[KernelPlan],
    name: str | None = None,
    inputs: Sequence[TensorInfo] | None = None,
    outputs: Sequence[TensorInfo] | None = None,
) -> KernelPlan:
    """One kernel running the plans' engine work back to back with intermediates kept in SBUF.

    `inputs`/`outputs` are the fused kernel's HBM tensors; without them, a chain is assumed:
    each plan's first input matching an earlier plan's output is an intermediate, and only the
    last plan's outputs are stored.
    """
    work = [p for p in plans if not p.is_empty]
    if not work:
        first = plans[0] if plans else None
        return KernelPlan(name or "fused", first.op if first else "fused", (), 0, 0, 0)
    spec = get_spec(work[0].spec)
    if inputs is None:
        ext: list[TensorInfo] = []
        produced: list[TensorInfo] = []
        for p in work:
            chained = False
            for t in p.inputs:
                if not chained and t in produced:
                    produced.remove(t)
                    chained = True
                else:
                    ext.append(t)
            produced.extend(p.outputs)
        inputs = ext
    outputs = tuple(work[-1].outputs if outputs is None else outputs)
    inputs = tuple(inputs)
    computes = tuple(c for p in work for c in p.computes)
    if not computes:  # only data movement left: it happens inside SBUF
        computes = (
            _pass(spec, spec.vector, "tensor_copy", _elems(outputs), _itemsize(outputs), 0),
        )
    name = name or "fused_" + "_".join(ops.base_name(p.op) for p in work)
    op = work[0].op if len(work) == 1 else "+".join(p.op for p in work)
    reads = [t.nbytes for t in inputs]
    writes = [t.nbytes for t in outputs]
    gemms = tuple(g for p in work for g in p.gemms)
    return assemble(spec, name, op, "fused", inputs, outputs, reads, computes, writes, gemms)

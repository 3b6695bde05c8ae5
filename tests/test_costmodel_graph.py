"""A compiled graph as one NEFF (costmodel/graph.py): fusion, SBUF residency and spills, one
unit on the timeline with its groups overlapping."""

from __future__ import annotations

from neuron_explorer.backend.costmodel import DeviceTimeline, TensorInfo, get_spec, lower_op
from neuron_explorer.backend.costmodel.graph import GraphOp, lower_graph
from neuron_explorer.vocab.engines import DMA_ENGINE

SPEC = get_spec("trn1")


def T(*shape: int, dtype: str = "bfloat16") -> TensorInfo:
    return TensorInfo(shape, dtype)


def mlp_layer(rows: int, dim: int) -> list[GraphOp]:
    """x @ w, + b, relu, then @ w2: inputs are graph inputs (None), the result exported."""
    x, w, b, w2 = T(rows, dim), T(dim, dim), T(dim), T(dim, 64)
    h = T(rows, dim)
    return [
        GraphOp("aten::mm", (x, w), (h,), (None, None)),
        GraphOp("aten::add.Tensor", (h, b), (h,), ((0, 0), None)),
        GraphOp("aten::relu", (h,), (h,), ((1, 0),)),
        GraphOp("aten::mm", (h, w2), (T(rows, 64),), ((2, 0), None), (True,)),
    ]


def test_elementwise_chain_fuses_into_its_matmul_and_stays_in_sbuf():
    neff = lower_graph(mlp_layer(256, 512), "g", SPEC)
    assert [g.plan.name for g in neff.groups] == ["fused_mm_add_relu", "mm"]
    assert [g.ops for g in neff.groups] == [(0, 1, 2), (3,)]
    first, second = (g.plan for g in neff.groups)
    # the relu output is read by the next matmul from SBUF: neither written nor read back
    assert first.bytes_written == 0
    assert first.bytes_read == (256 * 512 + 512 * 512 + 512) * 2
    assert second.bytes_read == 512 * 64 * 2 and second.bytes_written == 256 * 64 * 2
    assert all(g.spilled_bytes == 0 for g in neff.groups)


def test_an_intermediate_past_sbuf_capacity_is_spilled_to_hbm_and_read_back():
    rows = 8192  # 8192 x 2048 bf16 = 32 MiB, past trn1's 12 MiB of resident intermediates
    neff = lower_graph(mlp_layer(rows, 2048), "g", SPEC)
    first, second = neff.groups
    h_bytes = rows * 2048 * 2
    assert first.spilled_bytes == h_bytes and first.plan.bytes_written == h_bytes
    # it reads h back, and w2 once per block of h that SBUF holds (h is 32 MiB: three blocks)
    assert second.plan.bytes_read == h_bytes + 3 * 2048 * 64 * 2
    # and the spilled read waits for the store: the consumer's compute starts after it
    run = DeviceTimeline(SPEC).submit(neff.plan, 0)
    stores = [s + i.dur_ns for s, i in zip(run.starts, neff.plan.instrs, strict=True)
              if i.engine == DMA_ENGINE and i.bytes_written and not i.bytes_read]  # fmt: skip
    consumer = second.instr_index[
        next(k for k, i in enumerate(second.plan.instrs) if i.engine != DMA_ENGINE)
    ]
    assert run.starts[consumer] >= max(stores[: len(stores) // 2])


def test_sibling_elementwise_chains_over_the_same_elements_run_as_one_loop():
    """NKIBench's AdamW reference: four inputs, one output, every op fused."""
    p, g, m, v = (T(1024, 1024, dtype="float32") for _ in range(4))
    t = T(1024, 1024, dtype="float32")
    P, G, M, V = ((-1 - k, 0) for k in range(4))  # graph inputs 0-3
    graph = [
        GraphOp("aten::mul.Tensor", (p,), (t,), (P,)),  # 1e-5 * theta
        GraphOp("aten::sub.Tensor", (p, t), (t,), (P, (0, 0))),
        GraphOp("aten::mul.Tensor", (m,), (t,), (M,)),  # a new chain: 0.9 * m
        GraphOp("aten::mul.Tensor", (g,), (t,), (G,)),
        GraphOp("aten::add.Tensor", (t, t), (t,), ((2, 0), (3, 0))),
        GraphOp("aten::mul.Tensor", (v,), (t,), (V,)),
        GraphOp("aten::sqrt", (t,), (t,), ((5, 0),)),
        GraphOp("aten::div.Tensor", (t, t), (t,), ((4, 0), (6, 0))),
        GraphOp("aten::sub.Tensor", (t, t), (t,), ((1, 0), (7, 0)), (True,)),
    ]
    (group,) = lower_graph(graph, "adamw", SPEC).groups
    assert group.plan.bytes_read == 1024 * 1024 * 4 * 4  # theta (read by two ops) once, m, g, v
    assert group.plan.bytes_written == 1024 * 1024 * 4
    assert "reciprocal" in {c.opcode for c in group.plan.computes}  # x / y on VectorE


def test_a_neff_is_one_unit_whose_independent_groups_overlap():
    x = T(512, 1024)
    ws = [T(1024, 1024) for _ in range(3)]
    graph = [GraphOp("aten::mm", (x, w), (T(512, 1024),), ((-1, 0), (-2 - k, 0)), (True,))
             for k, w in enumerate(ws)]  # fmt: skip
    neff = lower_graph(graph, "qkv", SPEC)
    assert len(neff.groups) == 3
    # x, a graph input all three read, is loaded once and stays in SBUF for the other two
    assert [g.plan.bytes_read for g in neff.groups] == [(512 + 1024) * 1024 * 2] + [
        1024 * 1024 * 2
    ] * 2
    run = DeviceTimeline(SPEC).submit(neff.plan, 1000)
    alone = sum(DeviceTimeline(SPEC).submit(g.plan, 0).dur_ns for g in neff.groups)
    assert run.start_ns >= 1000 and run.dur_ns < alone  # loads prefetched under compute
    spans = []
    for g in neff.groups:
        starts = [run.starts[n] for n in g.instr_index]
        spans.append((min(starts), max(s + i.dur_ns for s, i in zip(starts, g.plan.instrs,
                                                                     strict=True))))  # fmt: skip
    assert spans[1][0] < spans[0][1]  # the second projection starts before the first ends
    # a kernel submitted after the NEFF waits for all of it: the NEFF is one unit
    tl = DeviceTimeline(SPEC)
    first = tl.submit(neff.plan, 0)
    after = tl.submit(lower_op("aten::relu", [x], [x], SPEC), 0)
    assert after.start_ns >= first.end_ns


def test_only_a_matmul_reading_its_a_from_hbm_transposes_it():
    """The compiler lays an intermediate out for the matmul that reads it (K on the partitions);
    A as the graph got it is row-major in HBM and is transposed tile by tile on TensorE."""
    first, second = lower_graph(mlp_layer(256, 512), "g", SPEC).groups
    assert "nc_transpose" in {c.opcode for c in first.plan.computes}  # x, a graph input
    assert "nc_transpose" not in {c.opcode for c in second.plan.computes}  # relu's output


def _engine_ns(plan) -> dict[tuple[str, str], int]:
    busy: dict[tuple[str, str], int] = {}
    for i in plan.instrs:
        busy[i.engine, i.opcode] = busy.get((i.engine, i.opcode), 0) + i.dur_ns
    return busy


def silu_graph(rows: int, cols: int) -> list[GraphOp]:
    """NKIBench's silu reference x / (1 + exp(-x)), as the graph torch.compile hands over."""
    x, s = T(rows, cols, dtype="float32"), T(dtype="float32")
    return [
        GraphOp("aten::neg", (x,), (x,), ((-1, 0),)),
        GraphOp("aten::exp", (x,), (x,), ((0, 0),)),
        GraphOp("aten::add.Tensor", (x, s), (x,), ((1, 0), None)),
        GraphOp("aten::div.Tensor", (x, x), (x,), ((-1, 0), (2, 0)), (True,)),
    ]


def test_a_scale_by_a_scalar_folds_into_the_activation_that_reads_it():
    """exp(-x): the negation is the activation's scale, at no cost of its own; an op the
    activation does not read alone (or a non-affine one) keeps its instruction."""
    busy = _engine_ns(lower_graph(silu_graph(1024, 2048), "g", SPEC).plan)
    exp_alone = lower_op("aten::exp", [T(1024, 2048, dtype="float32")], [], spec=SPEC)
    assert busy["ScalarE", "activation"] == sum(
        i.dur_ns for i in exp_alone.instrs if i.engine == "ScalarE"
    )
    # one tensor_scalar is left (the + 1), not two: the neg is gone
    ts = [k for k in busy if k[1] == "tensor_scalar"]
    assert len(ts) == 1
    relu = silu_graph(1024, 2048)
    relu[0] = GraphOp("aten::relu", relu[0].inputs, relu[0].outputs, relu[0].sources)
    kept = _engine_ns(lower_graph(relu, "g", SPEC).plan)
    assert sum(v for k, v in kept.items() if k[1] == "tensor_scalar") > busy[ts[0]]


def test_a_division_pays_vectors_precise_reciprocal_and_scalar_ops_move_to_scalare():
    """x / y is a VectorE reciprocal (8 one-input passes, nki.isa.reciprocal) and a multiply;
    with VectorE loaded by it, the group's scalar add runs on ScalarE."""
    busy = _engine_ns(lower_graph(silu_graph(1024, 2048), "g", SPEC).plan)
    assert ("ScalarE", "tensor_scalar") in busy and ("VectorE", "tensor_scalar") not in busy
    mul = busy["VectorE", "tensor_tensor"]
    assert 7 * mul <= busy["VectorE", "reciprocal"] <= 9 * mul
    # a lone scalar op has nothing to balance against: it stays on VectorE
    x = T(1024, 2048, dtype="float32")
    lone = lower_graph([GraphOp("aten::mul.Tensor", (x, T(dtype="float32")), (x,),
                                ((-1, 0), None), (True,))], "g", SPEC)  # fmt: skip
    assert ("VectorE", "tensor_scalar") in _engine_ns(lone.plan)


def test_a_collective_runs_in_the_neff_on_the_collective_cores_and_its_reader_waits():
    """A tensor-parallel layer: o_proj's partial sums all-reduced over 32 ranks in the graph."""
    from neuron_explorer.backend.costmodel.collectives import ALL_REDUCE, collective_cost

    x, w, h = T(1, 128), T(128, 4096), T(1, 4096)
    graph = [
        GraphOp("aten::mm", (x, w), (h,), (None, None)),
        GraphOp("_c10d_functional::all_reduce", (h,), (h,), ((0, 0),), collective=(ALL_REDUCE, 32)),
        GraphOp("_c10d_functional::wait_tensor", (h,), (h,), ((1, 0),)),
        GraphOp("aten::add.Tensor", (h, h), (h,), ((2, 0), None), (True,)),
    ]
    neff = lower_graph(graph, "g", SPEC)
    assert [g.plan.name for g in neff.groups] == ["mm", "all_reduce", "add"]  # nothing fuses in
    cc = neff.groups[1].plan
    expected = collective_cost(ALL_REDUCE, 4096 * 2, 32, SPEC.collectives).transfer_ns
    assert [(i.engine, i.opcode, i.dur_ns) for i in cc.instrs] == [("CC", "all_reduce", expected)]
    assert cc.bytes_read == cc.bytes_written == 0  # the collective cores move it, not the DMA
    run = DeviceTimeline(SPEC).submit(neff.plan, 0)
    (at,) = neff.groups[1].instr_index
    reader = neff.groups[2]
    first = reader.instr_index[
        next(k for k, i in enumerate(reader.plan.instrs) if i.engine != DMA_ENGINE)
    ]
    assert run.starts[first] >= run.starts[at] + expected
    assert run.dur_ns > expected


def test_a_static_caches_update_writes_its_rows_in_place_and_attention_reads_the_cache():
    """`copy_(cache, index_copy(cache, 2, pos, k))`, as AOTAutograd keeps a KV cache's write:
    the rows are written, not the cache, and the attention reads the cache from HBM."""
    cache, k, q, pos = T(1, 1, 8192, 128), T(1, 1, 1, 128), T(1, 1, 1, 128), T(1, dtype="int64")
    out = T(1, 1, 1, 128)
    graph = [
        GraphOp("aten::index_copy", (cache, pos, k), (cache,), ((-1, 0), (-2, 0), (-3, 0))),
        GraphOp("aten::_scaled_dot_product_flash_attention_for_cpu", (q, cache, cache), (out,),
                ((-4, 0), (0, 0), (0, 0)), (True,)),
        GraphOp("aten::copy_", (cache, cache), (cache,), ((-1, 0), (0, 0))),
    ]  # fmt: skip
    update, attention = (g.plan for g in lower_graph(graph, "g", SPEC).groups)
    assert update.bytes_written == 128 * 2  # one row of the cache
    assert update.bytes_read < cache.nbytes
    assert attention.bytes_read >= cache.nbytes  # the whole cache, from HBM

"""Sanity of the NeuronCore cost model: roofline, tiles, DMA efficiency, fusion, specs."""

from __future__ import annotations

import ast
import json
from dataclasses import fields
from math import ceil
from pathlib import Path

import pytest

from neuron_explorer.backend.costmodel import (
    ENV_VAR,
    SPECS,
    DeviceSpec,
    DeviceTimeline,
    TensorInfo,
    fuse,
    get_spec,
    lower_op,
    set_default_spec,
)

ROOT = Path(__file__).resolve().parent.parent


def T(*shape: int, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(shape=shape, dtype=dtype)


def run(plan, spec=None):
    """Schedule one plan on an idle device and return its KernelRun."""
    return DeviceTimeline(spec or get_spec(plan.spec)).submit(plan, ready_ns=0)


def mm(m: int, k: int, n: int, dtype: str, spec: DeviceSpec, k_major: bool = True):
    """A @ B; `k_major`: A is a transposed view (the NKI tutorial's lhsT), which TensorE takes
    as it is, where a row-major A is transposed tile by tile first."""
    a = TensorInfo((m, k), dtype, transposed=k_major)
    return lower_op("aten::mm", [a, T(k, n, dtype=dtype)], [T(m, n, dtype=dtype)], spec=spec)


@pytest.fixture(autouse=True)
def _default_spec(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    set_default_spec(None)
    yield
    set_default_spec(None)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_large_bf16_matmul_reaches_but_never_exceeds_peak(name):
    spec = get_spec(name)
    plan = mm(4096, 4096, 4096, "bfloat16", spec)
    r = run(plan, spec)
    achieved = plan.flops / (r.dur_ns * 1e-9)
    assert plan.flops == 2 * 4096**3
    assert achieved <= spec.peak_flops_bf16
    assert achieved >= 0.8 * spec.peak_flops_bf16, achieved / spec.peak_flops_bf16
    # no single TensorE instruction runs faster than the array allows either
    for ins in r.instrs:
        if ins.engine == "TensorE":
            assert ins.flops / (ins.dur_ns * 1e-9) <= spec.peak_flops_bf16 * 1.001
    # a row-major A costs its transposes on TensorE and their copies out of PSUM, once per
    # block of B that SBUF holds (neuronx-cc's loop), so it is slower but no less correct
    row_major = mm(4096, 4096, 4096, "bfloat16", spec, k_major=False)
    opcodes = {c.opcode for c in row_major.computes}
    assert "nc_transpose" in opcodes and "nc_transpose" not in {c.opcode for c in plan.computes}
    assert run(row_major, spec).dur_ns > r.dur_ns


def test_trn2_peak_matches_published_figures():
    spec = get_spec("trn2")
    assert spec.tensor_engine_dim == 128
    assert spec.peak_flops_bf16 == pytest.approx(79e12, rel=0.01)
    assert spec.peak_flops_fp32 == pytest.approx(20e12, rel=0.02)
    assert spec.hbm_bytes_per_s * spec.cores_per_chip == pytest.approx(2.9e12)
    assert spec.sbuf_bytes == 28 * 2**20 and spec.psum_bytes == 2 * 2**20
    assert spec.dma_latency_ns == pytest.approx(1300) and spec.dma_min_efficient_bytes == 4096


@pytest.mark.parametrize("m,k,n", [(200, 200, 200), (130, 64, 300), (1000, 1000, 64)])
def test_unaligned_matmul_shows_wasted_tiles(m, k, n):
    spec = get_spec()
    plan = mm(m, k, n, "bfloat16", spec)
    dim = spec.tensor_engine_dim
    expected = (m * k) / (ceil(m / dim) * dim * ceil(k / dim) * dim)
    assert plan.tensor_utilization == pytest.approx(expected, rel=1e-6)
    assert plan.tensor_utilization < 1.0
    partial = [i for i in plan.instrs if i.engine == "TensorE" and i.utilization < 1.0]
    assert partial, "edge tiles must appear as instructions with utilization < 1"
    wasted = [i for i in run(plan, spec).instrs if i.engine == "TensorE" and i.wasted_share > 0]
    assert wasted
    args = json.loads(json.dumps(plan.event_args))
    assert args["matmul"] == {"batch": 1, "m": m, "k": k, "n": n}
    assert args["tensor_utilization"] == pytest.approx(expected, abs=1e-4)
    # the padded shape costs TensorE the same time: the waste is real time, not just a number
    padded = mm(ceil(m / dim) * dim, ceil(k / dim) * dim, n, "bfloat16", spec)
    assert padded.tensor_utilization == 1.0

    def tensor_busy(p):
        return sum(i.dur_ns for i in p.instrs if i.engine == "TensorE")

    assert tensor_busy(plan) == pytest.approx(tensor_busy(padded), rel=0.02)


def test_many_small_dma_transfers_reach_far_less_bandwidth():
    spec = get_spec()
    count, small = 512, 1024

    def bandwidth(nbytes: int, times: int) -> float:
        tl = DeviceTimeline(spec)
        plan = lower_op("aten::copy_", [T(nbytes // 4), T(nbytes // 4)], [T(nbytes // 4)], spec)
        assert {i.engine for i in plan.instrs} == {"DMA"}
        for _ in range(times):
            tl.submit(plan, ready_ns=0)
        return nbytes * times / (tl.drain_ns() * 1e-9)

    many_small = bandwidth(small, count)
    one_large = bandwidth(small * count * 32, 1)
    assert one_large <= spec.memory_bytes_per_s
    assert one_large >= 0.8 * spec.memory_bytes_per_s
    assert many_small < one_large / 10


def test_elementwise_op_is_memory_bound():
    spec = get_spec()
    x = T(4096, 4096)
    plan = lower_op("aten::add.Tensor", [x, x], [x], spec)
    r = run(plan, spec)
    assert plan.arithmetic_intensity < spec.machine_balance_fp32
    moved = plan.bytes_read + plan.bytes_written
    assert moved == 3 * x.nbytes
    bound = moved / spec.memory_bytes_per_s * 1e9
    assert bound <= r.dur_ns <= 1.2 * bound  # time set by bytes over bandwidth
    busy = r.busy_ns()
    assert busy["VectorE"] < 0.5 * r.dur_ns  # the engine waits on DMA: idle time is real


def test_fusion_keeps_intermediates_out_of_hbm():
    spec = get_spec()
    x = T(1024, 1024)
    add = lower_op("aten::add.Tensor", [x, x], [x], spec)
    relu = lower_op("aten::relu", [x], [x], spec)
    fused = fuse([add, relu], name="fused_add_relu")
    assert fused.name == "fused_add_relu"
    assert fused.bytes_read == 2 * x.nbytes and fused.bytes_written == x.nbytes
    assert add.bytes_read + relu.bytes_read == 3 * x.nbytes
    assert fused.flops == add.flops + relu.flops
    tl = DeviceTimeline(spec)
    tl.submit(add, 0)
    tl.submit(relu, 0)
    assert run(fused, spec).dur_ns < 0.85 * tl.drain_ns()
    explicit = fuse([add, relu], inputs=[x, x], outputs=[x, x])  # also keep the add's result
    assert explicit.bytes_written == 2 * x.nbytes


@pytest.mark.parametrize("name", sorted(SPECS))
def test_fp32_matmul_about_four_times_slower_than_bf16(name):
    spec = get_spec(name)
    bf16 = run(mm(2048, 2048, 2048, "bfloat16", spec), spec).dur_ns
    fp32 = run(mm(2048, 2048, 2048, "float32", spec), spec).dur_ns
    assert 3.5 <= fp32 / bf16 <= 4.5


def test_spec_selection_by_env_var_and_api(monkeypatch):
    assert get_spec().name == "trn2"
    monkeypatch.setenv(ENV_VAR, "trn1")
    assert get_spec().name == "trn1"
    set_default_spec("trn3")
    assert get_spec().name == "trn3"
    assert get_spec("trn2").name == "trn2"
    set_default_spec(None)
    assert get_spec().name == "trn1"
    with pytest.raises(ValueError, match="trn9"):
        get_spec("trn9")
    x = T(64, 64)
    assert lower_op("aten::add.Tensor", [x, x], [x]).spec == "trn1"


def test_generations_are_ordered():
    trn1, trn2, trn3 = (get_spec(n) for n in ("trn1", "trn2", "trn3"))
    chip = [s.peak_flops_bf16 * s.cores_per_chip for s in (trn1, trn2, trn3)]
    assert chip == sorted(chip) and chip[1] > 3 * chip[0]
    assert trn1.hbm_bytes_per_s_chip < trn2.hbm_bytes_per_s_chip < trn3.hbm_bytes_per_s_chip
    assert trn1.sbuf_bytes < trn2.sbuf_bytes < trn3.sbuf_bytes
    assert trn1.hbm_bytes < trn2.hbm_bytes < trn3.hbm_bytes
    x = T(4096, 4096, dtype="bfloat16")
    times = [run(lower_op("aten::mul.Tensor", [x, x], [x], s), s).dur_ns for s in (trn2, trn3)]
    assert times[1] < times[0]  # trn3 streams faster per core


def test_spec_to_dict_is_json_and_every_figure_has_a_source():
    for spec in SPECS.values():
        d = json.loads(json.dumps(spec.to_dict()))
        for key in ("peak_flops_bf16", "peak_flops_fp32", "hbm_bytes_per_s",
                    "dma_bytes_per_s", "dma_min_efficient_bytes", "tensor_engine_dim",
                    "sbuf_bytes", "psum_bytes", "clock_hz", "machine_balance", "runtime"):  # fmt: skip
            assert key in d, key
        hardware = {f.name for f in fields(DeviceSpec)} - {"name", "chip", "core", "runtime",
                                                           "sources", "policy", "collectives"}  # fmt: skip
        runtime = {"runtime." + f for f in d["runtime"]}
        links = {"collectives." + f for f in d["collectives"]}
        missing = (hardware | runtime | links) - set(d["sources"])
        assert not missing, f"{spec.name}: no source for {sorted(missing)}"


@pytest.mark.parametrize(
    "op,engines",
    [
        ("aten::mm", {"TensorE"}),
        ("aten::exp", {"ScalarE"}),
        ("aten::gelu", {"ScalarE"}),
        ("aten::index_select", {"GpSimdE"}),
        ("aten::embedding", {"GpSimdE"}),
        ("aten::sum.dim_IntList", {"VectorE"}),
        ("aten::mul.Tensor", {"VectorE"}),
        ("aten::maximum", {"VectorE"}),
        ("aten::native_layer_norm", {"VectorE", "ScalarE"}),
        ("aten::_softmax", {"VectorE", "ScalarE"}),
        ("aten::cat", set()),
        ("aten::clone", set()),
    ],
)
def test_ops_lower_to_their_engines(op, engines):
    x = T(256, 256)
    ins = [x, T(256, 256)] if op != "aten::index_select" else [x, T(64, dtype="int64")]
    plan = lower_op(op, ins, [x])
    used = {i.engine for i in plan.instrs} - {"DMA"}
    if op == "aten::mm":
        used -= {"VectorE"}  # PSUM evacuation
    assert used == engines
    assert any(i.engine == "DMA" for i in plan.instrs)


@pytest.mark.parametrize("op", ["aten::view", "aten::t", "aten::expand", "aten::permute",
                                "aten::as_strided", "aten::reshape", "aten::_unsafe_view"])  # fmt: skip
def test_views_cost_nothing(op):
    plan = lower_op(op, [T(8, 16)], [T(16, 8)])
    assert plan.is_empty and plan.flops == 0 and plan.bytes_read == 0
    r = run(plan)
    assert r.dur_ns == 0 and r.instrs == []


@pytest.mark.parametrize(
    "op,inputs,outputs",
    [
        ("aten::totally_new_op", [T(3, 5)], [T(3, 5)]),
        ("myns::custom.default", [T(7, dtype="bfloat16")], []),
        ("aten::mm", [T(5)], [T(5)]),  # not a matrix product by shape: falls back
        ("aten::convolution", [T(2, 2)], [T(2, 2)]),
        ("aten::add.Tensor", [T(), T()], [T()]),
        ("aten::add.Tensor", [T(0, 4), T(0, 4)], [T(0, 4)]),
        ("aten::_foreach_mul_.Scalar", [T(10), T(20), T(30)], [T(10), T(20), T(30)]),
        ("aten::linear", [T(4, 8, dtype="weird_dtype")], []),
        ("", [], []),
    ],
)
def test_unknown_or_odd_ops_lower_without_error(op, inputs, outputs):
    plan = lower_op(op, inputs, outputs)
    r = run(plan)
    assert r.end_ns >= r.start_ns >= 0


def test_conv_is_an_implicit_gemm_and_sdpa_two():
    x, w, out = T(8, 3, 32, 32), T(16, 3, 3, 3), T(8, 16, 30, 30)
    conv = lower_op("aten::convolution", [x, w, T(16)], [out])
    assert conv.flops == 2 * (8 * 30 * 30) * (3 * 3 * 3) * 16
    assert {i.engine for i in conv.instrs} >= {"TensorE", "DMA"}
    q = T(2, 4, 128, 64, dtype="bfloat16")
    sdpa = lower_op("aten::_scaled_dot_product_flash_attention_for_cpu", [q, q, q], [q])
    tensor_flops = sum(i.flops for i in sdpa.instrs if i.engine == "TensorE")
    assert tensor_flops == 2 * 2 * (2 * 4) * 128 * 64 * 128
    assert any(i.engine == "ScalarE" for i in sdpa.instrs)  # softmax exp stays on chip


def test_schedule_respects_dependencies_and_overlaps_dma_with_compute():
    spec = get_spec()
    plan = mm(2048, 2048, 2048, "bfloat16", spec)
    r = run(plan, spec)
    ends = [s.start_ns + s.dur_ns for s in r.instrs]
    for ins, ran in zip(plan.instrs, r.instrs, strict=True):
        assert all(ran.start_ns >= ends[d] for d in ins.deps)
    by_track: dict[str, list] = {}
    for ran in r.instrs:
        by_track.setdefault(ran.track, []).append(ran)
    for runs in by_track.values():  # a queue runs one instruction at a time
        runs.sort(key=lambda x: x.start_ns)
        assert all(
            a.start_ns + a.dur_ns <= b.start_ns for a, b in zip(runs, runs[1:], strict=False)
        )
    dma = [x for x in r.instrs if x.engine == "DMA" and x.bytes_read]
    pe = [x for x in r.instrs if x.engine == "TensorE"]
    assert any(d.start_ns < p.start_ns + p.dur_ns and p.start_ns < d.start_ns + d.dur_ns
               for d in dma for p in pe)  # fmt: skip
    assert all(
        t.startswith(("DMA q", "TensorE", "VectorE", "ScalarE", "GpSimdE")) for t in by_track
    )


def test_kernels_queue_behind_busy_engines_and_drain():
    spec = get_spec()
    tl = DeviceTimeline(spec)
    big = mm(1024, 1024, 1024, "float32", spec)
    a = tl.submit(big, ready_ns=1_000)
    b = tl.submit(big, ready_ns=1_000)
    assert a.start_ns == 1_000
    a_pe_end = max(i.start_ns + i.dur_ns for i in a.instrs if i.engine == "TensorE")
    assert min(i.start_ns for i in b.instrs if i.engine == "TensorE") >= a_pe_end
    assert tl.drain_ns() == max(a.end_ns, b.end_ns)
    assert b.start_ns == a.end_ns and b.dur_ns == a.dur_ns  # one kernel at a time, as the runtime
    late = tl.submit(lower_op("aten::relu", [T(8)], [T(8)], spec), ready_ns=10**12)
    assert late.start_ns == 10**12 and tl.drain_ns() == late.end_ns


def test_a_kernels_modeled_time_does_not_depend_on_when_the_host_launched_it():
    # the host's speed moves launch times; the kernels' durations and their sum must not move
    spec = get_spec()
    plans = [mm(512, 256, 384, "float32", spec), lower_op("aten::gelu", [T(512, 384)], [T(512, 384)], spec),
             lower_op("aten::sum", [T(512, 384)], [T()], spec)] * 4  # fmt: skip
    durations = []
    for gap in (0, 300, 5_000, 10**6):
        tl = DeviceTimeline(spec)
        durations.append([tl.submit(p, ready_ns=i * gap).dur_ns for i, p in enumerate(plans)])
    assert all(d == durations[0] for d in durations)


def _reference_schedule(plans_and_ready, spec):
    """The timeline's rule written plainly: a kernel is ready at its launch or when the previous
    kernel has ended, whichever is later; each instruction starts when its queue is free, its
    dependencies are done and its kernel is ready; DMA queues rotate per kernel."""
    free: dict = {}
    rot, out = 0, []
    for plan, launched in plans_and_ready:
        ready = max(launched, *free.values()) if free else launched
        ends: list[int] = []
        starts = []
        for ins in plan.instrs:
            res = (
                f"DMA q{(ins.queue + rot) % spec.dma_queues}" if ins.engine == "DMA" else ins.engine
            )
            t = max([free.get(res, 0), ready, *(ends[d] for d in ins.deps)])
            starts.append(t)
            ends.append(t + ins.dur_ns)
            free[res] = t + ins.dur_ns
        rot = (rot + plan.dma_queues_used) % spec.dma_queues
        out.append(tuple(starts))
    return out, max(free.values())


def test_timeline_idle_fast_path_equals_the_plain_schedule():
    # an idle device places a kernel at its precomputed idle schedule; a busy one runs the loop
    spec = get_spec()
    plans = [
        lower_op("aten::add", [T(8), T(8)], [T(8)], spec),
        mm(300, 200, 129, "float32", spec),
        lower_op("aten::exp", [T(4096, 512)], [T(4096, 512)], spec),
        mm(2048, 2048, 2048, "bfloat16", spec),
        lower_op("aten::sum", [T(64, 256)], [T()], spec),
    ]
    # alternate a busy device (ready times close together) with idle gaps
    seq = [(plans[i % len(plans)], (i // 3) * (10**7 if i % 4 == 0 else 500)) for i in range(40)]
    want, drain = _reference_schedule(seq, spec)
    tl = DeviceTimeline(spec)
    got = [tl.submit(plan, ready).starts for plan, ready in seq]
    assert got == want
    assert tl.drain_ns() == drain


def test_runtime_costs_are_modeled():
    rt = get_spec().runtime
    for value in (rt.launch_ns, rt.eager_compile_ns, rt.graph_compile_ns_base,
                  rt.graph_compile_ns_per_node, rt.sync_ns):  # fmt: skip
        assert isinstance(value, int) and value > 0
    assert rt.graph_compile_ns_base > rt.eager_compile_ns > rt.launch_ns
    assert rt.h2d_bytes_per_s > 1e9 and rt.d2h_bytes_per_s > 1e9


def test_cost_model_never_imports_torch():
    for path in sorted((ROOT / "neuron_explorer" / "backend" / "costmodel").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path


def test_every_figure_is_documented():
    doc = (ROOT / "docs" / "costmodel.md").read_text(encoding="utf-8")
    spec = get_spec()
    names = [f.name for f in fields(DeviceSpec)] + [
        f"runtime.{k}" for k in spec.to_dict()["runtime"]
    ]
    names += [f.name for f in fields(spec.policy)]
    missing = [n for n in names if n not in ("name", "chip", "core", "sources", "policy", "runtime")
               and n not in doc]  # fmt: skip
    assert not missing, f"docs/costmodel.md does not mention {missing}"
    assert "not a measurement" in doc


def test_gathers_read_the_rows_they_fetch_and_scatters_everything():
    weight, idx, out = T(50_000, 512), T(8, 128, dtype="int64"), T(8, 128, 512)
    emb = lower_op("aten::embedding", [weight, idx], [out])
    assert emb.bytes_read == idx.nbytes + out.nbytes < weight.nbytes
    pool_in = T(8, 64, 32, 32)
    pool = lower_op("aten::max_pool2d_with_indices", [pool_in], [T(8, 64, 16, 16)] * 2)
    assert pool.bytes_read == pool_in.nbytes
    grad = lower_op("aten::embedding_dense_backward", [out, idx], [weight])
    assert grad.bytes_read == out.nbytes + idx.nbytes and grad.bytes_written == weight.nbytes


def test_attention_backward_is_five_gemms_on_the_right_operands():
    q, k = T(2, 4, 128, 64, dtype="bfloat16"), T(2, 4, 256, 64, dtype="bfloat16")
    grad_out, lse = q, T(2, 4, 128)
    bwd = lower_op(
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        [grad_out, q, k, k, q, lse],
        [q, k, k],
    )
    assert len(bwd.gemms) == 5
    assert sum(2 * b * m * kk * n for b, m, kk, n in bwd.gemms) == 5 * 2 * 8 * 128 * 256 * 64


def test_multi_tensor_ops_cost_the_whole_list():
    params = [T(128, 384), T(384), T(384, 128), T(128)] * 2  # layers repeat their shapes
    one = lower_op("aten::_foreach_add_.List", params[:1] * 2, [])
    many = lower_op("aten::_foreach_add_.List", params * 2, [])
    assert many.flops == sum(t.numel for t in params) > one.flops
    assert many.bytes_written == sum(t.nbytes for t in params)
    adam = lower_op("aten::_fused_adamw_", params * 4 + [T()] * len(params), [])
    assert adam.bytes_read == 4 * sum(t.nbytes for t in params) + 4 * len(params)  # + steps
    assert adam.bytes_written == 3 * sum(t.nbytes for t in params)  # params and two moments
    assert run(adam).dur_ns > run(many).dur_ns


def test_collectives_follow_the_ring_bounds_and_cross_instances_over_efa():
    from neuron_explorer.backend.costmodel.collectives import collective_cost
    from neuron_explorer.backend.costmodel.spec import CC_TRN2

    mb = 64 << 20  # past the mesh and RDH ranges: the ring
    ar = collective_cost("all_reduce", mb, 16, CC_TRN2)
    # 2(n-1)/n of the buffer through each rank at NeuronLink's 1.28 TB/s, plus 2(n-1) steps
    expect = 2 * 15 / 16 * mb / 1.28e12 * 1e9 + 30 * CC_TRN2.step_latency_ns
    assert ar.link == "neuronlink" and ar.algorithm == "ring"
    assert abs(ar.transfer_ns - expect) <= 1
    ag = collective_cost("all_gather", mb, 16, CC_TRN2)
    assert abs(ag.transfer_ns - (15 / 16 * mb / 1.28e12 * 1e9 + 15 * CC_TRN2.step_latency_ns)) <= 1
    # 128 ranks span two instances of 64: the same all-reduce is EFA-bound, tens of times slower
    far = collective_cost("all_reduce", mb, 128, CC_TRN2)
    assert far.link == "efa" and far.transfer_ns > 20 * ar.transfer_ns
    assert collective_cost("all_reduce", mb, 1, CC_TRN2).transfer_ns == 0
    assert collective_cost("barrier", 0, 8, CC_TRN2).transfer_ns == 6 * CC_TRN2.step_latency_ns


def test_a_small_all_reduce_costs_the_floor_whatever_the_group_size():
    """Under the mesh range an all-reduce takes two hops at any group size within an instance
    (the runtime's mesh algorithm): the trn1 floor of 2 ranks is the floor of 32; a mid-size
    one takes log2(n) hops a pass (RDH), and a group across instances rings over EFA."""
    from neuron_explorer.backend.costmodel.collectives import collective_cost
    from neuron_explorer.backend.costmodel.spec import CC_TRN1

    small = [collective_cost("all_reduce", 8 << 10, n, CC_TRN1) for n in (2, 8, 32)]
    assert {c.algorithm for c in small} == {"mesh"} and {c.link for c in small} == {"neuronlink"}
    floor = CC_TRN1.launch_ns + 2 * CC_TRN1.step_latency_ns
    assert all(floor <= c.transfer_ns <= floor + 1_000 for c in small)  # the bytes: < 1 us
    mid = collective_cost("all_reduce", 8 << 20, 32, CC_TRN1)
    bus = 2 * 31 / 32 * (8 << 20) / CC_TRN1.link_bytes_per_s * 1e9
    assert mid.algorithm == "rdh"
    assert abs(mid.transfer_ns - (CC_TRN1.launch_ns + bus + 10 * CC_TRN1.step_latency_ns)) <= 1
    far = collective_cost("all_reduce", 8 << 10, 64, CC_TRN1)
    assert far.link == "efa" and far.algorithm == "ring"
    assert far.transfer_ns >= floor + 124 * CC_TRN1.step_latency_ns  # 126 hops, not 2

"""Grouped matmuls (MoE experts) and declared TensorE kernels in the cost model (issue 28)."""

from __future__ import annotations

import pytest

from neuron_explorer.backend.costmodel import TensorInfo, custom, get_spec, lower_op


def T(*shape: int, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(shape=shape, dtype=dtype)


def tensor_ns(plan) -> int:
    return sum(i.dur_ns for i in plan.instrs if i.engine == "TensorE")


@pytest.fixture
def declared():
    names: list[str] = []

    def declare(name: str, **kernel) -> str:
        custom.declare(name, custom.DeclaredKernel(**kernel))
        names.append(name)
        return name

    yield declare
    for name in names:
        del custom._DECLARED[name]


def test_a_grouped_matmul_is_one_gemm_per_expert_under_uniform_routing():
    # 37 rows over 4 experts: uniform routing gives one expert 10 rows and three 9
    x, w, offs, out = T(37, 64), T(4, 64, 96), T(4, dtype="int32"), T(37, 96)
    grouped = lower_op("aten::_grouped_mm", [x, w, offs], [out])
    assert grouped.category == "matmul" and grouped.gemms == ((1, 10, 64, 96), (3, 9, 64, 96))
    assert grouped.flops == 2 * 37 * 64 * 96 == sum(i.flops for i in grouped.instrs
                                                    if i.engine == "TensorE")  # fmt: skip
    # each expert fills its own stationary tiles: four partial tiles where one GEMM of the
    # same rows streams its columns once
    plain = lower_op("aten::mm", [x, T(64, 96)], [out])
    assert tensor_ns(grouped) > 3 * tensor_ns(plain)


def test_the_weight_gradient_of_a_grouped_matmul_contracts_each_experts_rows_once():
    # (K, S) @ (S, N) -> (E, K, N): before, read as one (E*K) x S x N product, E times the work
    xt, grad, offs = TensorInfo((64, 37), transposed=True), T(37, 96), T(4, dtype="int32")
    plan = lower_op("aten::_grouped_mm", [xt, grad, offs], [T(4, 64, 96)])
    assert plan.flops == 2 * 64 * 37 * 96
    assert plan.gemms == ((1, 64, 10, 96), (3, 64, 9, 96))
    assert not any(i.opcode == "nc_transpose" for i in plan.instrs)  # A is K-major already


def test_a_declared_tensore_kernel_is_priced_as_the_devices_own_matmul(declared):
    op = declared("nxtests::my_mm", engine="TensorE", flops=None,
                  gemms=lambda a, b: [(1, a[0], a[1], b[1])])  # fmt: skip
    a, b, out = T(300, 200, dtype="bfloat16"), T(200, 700, dtype="bfloat16"), T(300, 700)
    mine, aten = lower_op(op, [a, b], [out]), lower_op("aten::mm", [a, b], [out])
    assert mine.category == "custom"  # its own group in a NEFF: nothing fuses into it
    assert (mine.instrs, mine.flops, mine.gemms) == (aten.instrs, aten.flops, aten.gemms)


def test_a_tensore_kernel_declared_by_flops_runs_full_tiles(declared):
    dim = get_spec().tensor_engine_dim
    op = declared("nxtests::dense", engine="TensorE", flops=lambda a: 2 * a[0] * a[1] * a[1])
    plan = lower_op(op, [T(dim, 4 * dim)], [T(dim, 4 * dim)])
    assert plan.gemms == ((1, dim, dim, 16 * dim),)
    assert plan.flops == 2 * dim * (4 * dim) ** 2


def test_a_declaration_names_work_its_engine_can_do():
    with pytest.raises(ValueError, match="TensorE"):
        custom.DeclaredKernel("VectorE", None, gemms=lambda a: [(1, 1, 1, 1)])
    with pytest.raises(ValueError, match="flops="):
        custom.DeclaredKernel("ScalarE", None)
    with pytest.raises(ValueError, match="engine must be one of TensorE"):
        custom.DeclaredKernel("PE", 1)


def test_shapes_a_declaration_cannot_read_lower_without_error(declared):
    # a library op called with another signature than its declaration reads: priced as an
    # aten matmul of unreadable shapes is, one VectorE pass, never an exception on the op path
    op = declared("nxtests::grouped", engine="TensorE", flops=None,
                  gemms=lambda x, w, offs: [(1, x[0], x[1], w[2])])  # fmt: skip
    plan = lower_op(op, [T(8, 4)], [T(8, 4)])
    assert plan.category == "custom" and {i.engine for i in plan.instrs} == {"VectorE", "DMA"}


def test_a_captured_grouped_matmul_is_uniform_in_every_mode_and_the_manifest_says_so(tmp_path):
    # the offsets are data: skewed and even routing cost the same, eager and compiled, and
    # the profile's manifest says the groups were taken uniform (issue 28)
    import json

    import torch

    import neuron_explorer
    from neuron_explorer.model.profile import Profile

    x = torch.randn(64, 32, device="neuron", dtype=torch.bfloat16)
    w = torch.randn(4, 32, 16, device="neuron", dtype=torch.bfloat16)
    even = torch.tensor([16, 32, 48, 64], device="neuron", dtype=torch.int32)
    skewed = torch.tensor([1, 2, 3, 64], device="neuron", dtype=torch.int32)

    def grouped(x, w, offs):
        return torch._grouped_mm(x, w, offs=offs)

    compiled = torch.compile(grouped, backend="neuron")
    with torch.profiler.profile(on_trace_ready=neuron_explorer.trace_handler(tmp_path / "p")):
        for offs in (even, skewed):
            grouped(x, w, offs)
            compiled(x, w, offs)
        torch.neuron.synchronize()
    kernels = (
        Profile.open(tmp_path / "p")
        .duckdb()
        .execute(
            "SELECT dur_ns FROM events WHERE kind = 'kernel' AND name = '_grouped_mm' ORDER BY start_ns"
        )
        .fetchall()
    )
    assert len(kernels) == 4 and kernels[0] == kernels[2] and kernels[1] == kernels[3]
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["extra"]["grouped_matmul"] == {"groups": "uniform",
                                                   "kernels": {"_grouped_mm": 4}}  # fmt: skip

"""Logical NeuronCores (NEURON_LOGICAL_NC_CONFIG): two physical cores of trn2 or trn3 modeled
as one, the work of a kernel split over them where it splits; trn1 refuses."""

from __future__ import annotations

import json

import pytest

from neuron_explorer.backend.costmodel import (
    ENV_VAR,
    DeviceTimeline,
    TensorInfo,
    get_spec,
    lower_op,
    set_default_spec,
)
from neuron_explorer.backend.costmodel.lnc import LNC_ENV_VAR


@pytest.fixture(autouse=True)
def _default_spec(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv(LNC_ENV_VAR, raising=False)
    set_default_spec(None)
    yield
    set_default_spec(None)


def _dur(op, inputs, outputs, spec) -> int:
    plan = lower_op(op, inputs, outputs, spec=spec)
    return DeviceTimeline(spec).submit(plan, ready_ns=0).dur_ns


def _mm(m, k, n, spec, k_major=True, dtype="bfloat16") -> int:
    a = TensorInfo((m, k), dtype, transposed=k_major)
    return _dur("aten::mm", [a, TensorInfo((k, n), dtype)], [TensorInfo((m, n), dtype)], spec)


@pytest.mark.parametrize("chip", ["trn2", "trn3"])
def test_a_large_bf16_matmul_is_about_twice_as_fast_on_the_pair(chip):
    one, two = get_spec(chip), get_spec(f"{chip}-lnc2")
    for k_major in (True, False):  # the NKI tutorial's lhsT, and a row-major A transposed
        ratio = _mm(4096, 8192, 8192, one, k_major) / _mm(4096, 8192, 8192, two, k_major)
        assert 1.8 <= ratio <= 2.1, (k_major, ratio)
    # a memory-bound one too: the pair streams the weights over both cores' DMA queues
    assert 1.8 <= _mm(1, 4096, 11008, one, False) / _mm(1, 4096, 11008, two, False) <= 2.1
    big = TensorInfo((4096, 4096), "bfloat16")
    add = [_dur("aten::add.Tensor", [big, big], [big], s) for s in (one, two)]
    assert 1.6 <= add[0] / add[1] <= 2.1


@pytest.mark.parametrize("chip", ["trn2", "trn3"])
def test_a_tiny_op_is_not_faster_on_the_pair(chip):
    one, two = get_spec(chip), get_spec(f"{chip}-lnc2")
    x = TensorInfo((16,), "float32")
    assert _dur("aten::add.Tensor", [x, x], [x], two) == _dur("aten::add.Tensor", [x, x], [x], one)
    # one tile of TensorE work and one of each DMA: nothing to split, fixed costs not halved
    assert _mm(8, 8, 8, two) == _mm(8, 8, 8, one)


def test_the_pairs_figures_are_twice_one_cores_and_never_beaten():
    one, two = get_spec("trn2"), get_spec("trn2-lnc2")
    assert two.logical_cores == 2 and one.logical_cores == 1
    assert two.peak_flops_bf16 == 2 * one.peak_flops_bf16
    assert two.hbm_bytes_per_s == 2 * one.hbm_bytes_per_s  # the HBM bank of the pair
    assert (two.sbuf_bytes, two.dma_queues) == (2 * one.sbuf_bytes, 2 * one.dma_queues)
    assert two.cores_per_chip == 4 and two.vector == one.vector  # each engine stays one core's
    a = TensorInfo((4096, 4096), "bfloat16", transposed=True)
    plan = lower_op("aten::mm", [a, TensorInfo((4096, 4096), "bfloat16")],
                    [TensorInfo((4096, 4096), "bfloat16")], spec=two)  # fmt: skip
    run = DeviceTimeline(two).submit(plan, ready_ns=0)
    assert plan.flops / (run.dur_ns * 1e-9) <= two.peak_flops_bf16
    assert plan.spec == "trn2-lnc2" and get_spec(plan.spec) == two  # fuse finds it again
    assert max(int(r.track.removeprefix("DMA q")) for r in run.instrs if r.engine == "DMA") > 15
    d = json.loads(json.dumps(two.to_dict()))
    assert d["logical_cores"] == 2 and "logical-neuroncore-config" in d["sources"]["logical_cores"]


def test_the_environment_sets_the_lnc_and_trn1_refuses_two(monkeypatch):
    assert get_spec().name == "trn2" and get_spec().logical_cores == 1  # the default: LNC=1
    monkeypatch.setenv(LNC_ENV_VAR, "2")
    assert get_spec().name == "trn2-lnc2"
    set_default_spec("trn3")
    assert get_spec().name == "trn3-lnc2"
    assert get_spec("trn3").logical_cores == 1  # a named spec is that spec
    set_default_spec("trn1")
    with pytest.raises(ValueError, match=r"NEURON_LOGICAL_NC_CONFIG=2: trn1 .*supported: 1\)$"):
        get_spec()
    with pytest.raises(ValueError, match="trn1"):
        get_spec("trn1-lnc2")
    monkeypatch.setenv(LNC_ENV_VAR, "1")
    assert get_spec().name == "trn1"
    set_default_spec("trn2-lnc2")
    assert get_spec().name == "trn2"  # the environment's LNC wins over the name's
    monkeypatch.setenv(LNC_ENV_VAR, "4")
    with pytest.raises(ValueError, match="only 1 or 2"):
        get_spec()


def test_capture_refuses_lnc2_on_trn1_in_one_line(monkeypatch, capsys, tmp_path):
    from neuron_explorer.cli import main

    monkeypatch.setenv(ENV_VAR, "trn1")
    monkeypatch.setenv(LNC_ENV_VAR, "2")
    assert main(["capture", "-o", str(tmp_path / "p"), "--", "python", "-c", "pass"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "NEURON_LOGICAL_NC_CONFIG=2: trn1" in err
    assert not (tmp_path / "p").exists()


def test_a_captures_manifest_records_the_lnc(tmp_path):
    import torch

    import neuron_explorer
    from neuron_explorer import backend
    from neuron_explorer.model.profile import Profile

    try:
        backend.set_device_spec("trn2-lnc2")
        x = torch.randn(64, 64, device="neuron")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    on_trace_ready=neuron_explorer.trace_handler(tmp_path / "p")):  # fmt: skip
            (x @ x).sum().item()
    finally:
        backend.set_device_spec(None)
    spec = Profile.open(tmp_path / "p").manifest.device_spec
    assert (spec["name"], spec["logical_cores"], spec["cores_per_chip"]) == ("trn2-lnc2", 2, 4)

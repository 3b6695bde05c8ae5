"""The neuron device as a user sees it: tensors, printing, views, saving, errors, device APIs."""

from __future__ import annotations

import gc
import io
import warnings
from pathlib import Path

import pytest
import torch

from neuron_explorer import backend
from neuron_explorer.backend.tensor import NeuronTensor

NEURON = torch.device("neuron", 0)


def test_factories_and_copies_keep_values_and_device():
    torch.manual_seed(0)
    x = torch.randn(3, 4, device="neuron")
    torch.manual_seed(0)
    ref = torch.randn(3, 4)
    assert x.device == NEURON and isinstance(x, NeuronTensor)
    assert torch.equal(x.cpu(), ref)
    t = torch.tensor([[1, 2], [3, 4]], device="neuron")
    assert t.dtype == torch.int64 and t.cpu().tolist() == [[1, 2], [3, 4]]
    assert torch.equal(ref.to("neuron").cpu(), ref)
    assert torch.zeros(2, 2, device="neuron").cpu().sum().item() == 0
    assert torch.full((2,), 7.0, device="neuron").tolist() == [7.0, 7.0]


def test_printing_matches_cuda_style():
    x = torch.tensor([1.5, -2.0], device="neuron", requires_grad=True)
    assert repr(x) == "tensor([ 1.5000, -2.0000], device='neuron:0', requires_grad=True)"
    assert str(torch.tensor(3, device="neuron", dtype=torch.int32)) == (
        "tensor(3, device='neuron:0', dtype=torch.int32)"
    )
    assert "grad_fn=<MulBackward0>" in repr(x * 2)
    assert f"{torch.tensor(2.25, device='neuron'):.1f}" == "2.2"


def test_indexing_views_and_in_place_share_storage_like_cpu():
    x = torch.arange(12.0, device="neuron").view(3, 4)
    ref = torch.arange(12.0).view(3, 4)
    for t in (x, ref):
        row = t[1]
        row.add_(100)
        t[:, 0] = -1
        t.t()[2].mul_(2)
        t[t > 105] = 0
    assert torch.equal(x.cpu(), ref)
    assert x[torch.tensor([0, 2])].cpu().tolist() == ref[torch.tensor([0, 2])].tolist()
    assert x.transpose(0, 1).contiguous().cpu().tolist() == ref.t().contiguous().tolist()


def test_save_and_load_device_tensors_and_state_dicts():
    model = torch.nn.Linear(3, 2).to("neuron")
    x = torch.randn(4, device="neuron")
    buf = io.BytesIO()
    torch.save({"x": x, "state": model.state_dict()}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["x"].device == NEURON and torch.equal(loaded["x"].cpu(), x.cpu())
    fresh = torch.nn.Linear(3, 2).to("neuron")
    fresh.load_state_dict(loaded["state"])
    assert torch.equal(fresh.weight.cpu(), model.weight.cpu())


@pytest.mark.parametrize("where", ["neuron", torch.device("neuron"), {"cpu": "neuron"}])
def test_load_with_map_location_neuron_puts_every_tensor_on_the_device(where):
    """`torch.load(f, map_location="neuron")` (ZeroRedundancyOptimizer's consolidate_state_dict
    loads each rank's state so): CPU and neuron tensors alike come back on the device, with
    their values, dtypes and views; `torch.neuron.device` is torch.cuda.device's shape."""
    model = torch.nn.Linear(3, 2)
    state = {"cpu": torch.arange(6.0).reshape(2, 3), "half": torch.ones(2, dtype=torch.bfloat16),
             "neuron": torch.arange(4.0, device="neuron"), "model": model.state_dict()}  # fmt: skip
    state["view"] = state["cpu"][1]
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location=where)
    for key in ("cpu", "half", "neuron", "view"):
        assert loaded[key].device == NEURON and loaded[key].dtype == state[key].dtype
        assert torch.equal(loaded[key].cpu(), state[key].cpu()), key
    assert loaded["model"]["weight"].device == NEURON
    assert torch.equal(loaded["model"]["weight"].cpu(), model.weight)
    buf.seek(0)
    assert torch.load(buf, map_location="cpu")["neuron"].device.type == "cpu"  # still honoured
    with torch.neuron.device(0):
        assert torch.neuron.current_device() == 0
    with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
        torch.neuron.device(1)


def test_mixing_cpu_and_neuron_tensors_is_a_clear_error_but_scalars_are_fine():
    x = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="same device.*neuron:0 and cpu"):
        x + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(torch.ones(3, 3), torch.ones(3, 3, device="neuron"))
    assert (x + torch.tensor(2.0)).cpu().tolist() == [3.0, 3.0, 3.0]
    assert (x * 2).device == NEURON
    with pytest.raises(TypeError, match="cpu"):
        x.numpy()


def test_device_modules_and_accelerator_api():
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == 1
    torch.accelerator.synchronize()
    assert torch.neuron.is_available() and torch.neuron.device_count() == 1
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(0)
    torch.neuron.synchronize()
    torch.neuron.manual_seed(5)
    a = torch.randn(3, device="neuron")
    torch.manual_seed(5)
    assert torch.equal(a.cpu(), torch.randn(3))
    assert torch.device("neuron").type == "neuron" and torch.ones(1).neuron().device == NEURON


def test_memory_accounting_counts_allocations_and_frees():
    gc.collect()  # tensors of earlier tests must not be freed in the middle of this one
    torch.neuron.reset_peak_memory_stats()
    before = torch.neuron.memory_allocated()
    x = torch.empty(1024, 256, device="neuron")  # 1 MiB of float32
    assert torch.neuron.memory_allocated() - before == 1 << 20
    view = x[:10]
    assert torch.neuron.memory_allocated() - before == 1 << 20  # views allocate nothing
    y = x * 2
    assert torch.neuron.max_memory_allocated() - before >= 2 << 20
    del x, view, y
    assert torch.neuron.memory_allocated() == before
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == before


def test_memory_is_counted_per_storage_so_a_view_keeps_its_base_allocated():
    # detach() and .data are views that do not keep their base tensor alive (no ._base)
    gc.collect()
    torch.neuron.reset_peak_memory_stats()
    before = torch.neuron.memory_allocated()
    base = torch.randn(512, 512, device="neuron")  # 1 MiB of float32
    view = base.detach()[100:]
    alias = base.data.t()
    assert view._base is None or view._base is not base
    assert torch.neuron.memory_allocated() - before == 1 << 20
    del base
    gc.collect()
    assert torch.neuron.memory_allocated() - before == 1 << 20  # the views still hold it
    doubled = view * 2  # a fresh storage: 412 x 512 float32
    fresh = 412 * 512 * 4
    assert torch.neuron.memory_allocated() - before == (1 << 20) + fresh
    assert torch.equal(doubled.cpu(), alias.t()[100:].cpu() * 2)
    del view
    assert torch.neuron.memory_allocated() - before == (1 << 20) + fresh  # alias remains
    del alias
    assert torch.neuron.memory_allocated() - before == fresh  # the last view went
    assert torch.neuron.max_memory_allocated() - before == (1 << 20) + fresh
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() - before == fresh
    del doubled
    assert torch.neuron.memory_allocated() == before
    assert torch.neuron.max_memory_allocated() - before == fresh  # the peak stays until reset


def test_float64_runs_as_float32_with_a_warning():
    x = torch.tensor([1.0 + 1e-12, 1 / 3], dtype=torch.float64, device="neuron")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        y = x * 1.0
    assert y.dtype == torch.float64
    as_f32 = (torch.tensor([1.0 + 1e-12, 1 / 3], dtype=torch.float64).float()).double()
    assert torch.equal(y.cpu(), as_f32)
    assert not torch.equal(y.cpu(), torch.tensor([1.0 + 1e-12, 1 / 3], dtype=torch.float64))


def test_unsupported_ops_fall_back_to_cpu_once_with_a_warning():
    backend.clear_op_tracking()
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torch.nonzero(x)
        second = torch.nonzero(x + 1)
    fallback_warnings = [w for w in caught if "aten::nonzero" in str(w.message)]
    assert len(fallback_warnings) <= 1  # once per process (it may have fired earlier)
    assert first.device == NEURON and first.cpu().flatten().tolist() == [1, 3]
    assert second.cpu().flatten().tolist() == [0, 1, 2, 3]
    assert backend.get_fallback_ops() == ["aten::nonzero"]
    assert "aten::add" in backend.get_executed_ops()
    assert "aten::nonzero" not in backend.get_executed_ops()
    backend.clear_op_tracking()
    assert backend.get_executed_ops() == [] and backend.get_fallback_ops() == []


def test_eager_compile_cache_is_keyed_by_op_shapes_and_dtypes():
    a, b = torch.ones(5, device="neuron"), torch.ones(6, device="neuron")
    backend.reset_compile_stats()
    for _ in range(3):
        a.sin()
    s = backend.compile_stats()
    assert (s.eager_compiles, s.eager_cache_hits) == (1, 2)
    b.sin()
    a.half().sin()  # _to_copy to half is a compile too
    assert backend.compile_stats().eager_compiles == 4


def test_supported_ops_table_is_documented():
    doc = Path(backend.__path__[0]).parents[1] / "docs" / "device.md"
    text = open(doc, encoding="utf-8").read()
    ops = backend.supported_ops()
    assert "aten::mm" in ops and "aten::nonzero" not in ops
    from neuron_explorer.backend.costmodel import custom

    # the built-in table; an op a program gave a kernel (register_kernel, as the compile
    # tests do) is its own, not the docs'
    missing = [op for op in ops if f"`{op}`" not in text and custom.declared(op) is None]
    assert not missing, f"docs/device.md does not list {missing}"


def test_dataloader_pin_memory_generators_and_host_results_work():
    data = torch.utils.data.TensorDataset(torch.arange(8.0).view(4, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True)
    batches = [b[0].to("neuron", non_blocking=True) for b in loader]
    assert [b.cpu().tolist() for b in batches] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    x = torch.ones(2, device="neuron")
    assert torch.zeros_like(x, device="cpu").device.type == "cpu"
    g = torch.Generator(device="neuron").manual_seed(3)
    a = torch.randn(3, generator=g, device="neuron")
    assert torch.equal(a.cpu(), torch.randn(3, generator=torch.Generator().manual_seed(3)))


def test_data_assignment_out_resizes_and_in_place_restrides_keep_the_wrapper_in_step():
    layer = torch.nn.Linear(2, 3).to("neuron")
    layer.weight.data = torch.ones(4, 2, device="neuron")
    assert layer.weight.shape == (4, 2) and layer.weight.cpu().tolist() == [[1.0, 1.0]] * 4
    out = torch.empty(0, device="neuron")
    torch.add(torch.ones(3, device="neuron"), 1, out=out)
    assert out.shape == (3,) and out.cpu().tolist() == [2.0, 2.0, 2.0]
    t = torch.arange(6.0, device="neuron").view(2, 3)
    t.t_()
    assert t.shape == (3, 2) and t.cpu().tolist() == torch.arange(6.0).view(2, 3).t().tolist()
    half = torch.nn.Linear(2, 2).to("neuron").half()
    assert half.weight.dtype == torch.float16 and isinstance(half.weight, NeuronTensor)
    assert half(torch.ones(1, 2, device="neuron", dtype=torch.float16)).dtype == torch.float16


def test_inference_mode_views_item_and_an_eval_model_run_on_the_device():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(16, 4)
    with torch.no_grad():
        ref = model.eval()(x)
    model.to("neuron")
    xd = x.to("neuron")
    backend.clear_op_tracking()
    with torch.inference_mode():
        view = xd.view(64)  # a view of a normal tensor stays a normal tensor, as on the CPU
        made = xd * 2  # a new tensor is an inference tensor, as on the CPU
        out = model(xd)
        total = out.sum().item()
    assert not view.is_inference() and made.is_inference() and made.view(64).is_inference()
    assert torch.equal(view.cpu(), x.view(64))
    assert torch.allclose(out.cpu(), ref, atol=1e-6) and out.is_inference()
    assert total == pytest.approx(ref.sum().item(), abs=1e-5)
    assert backend.get_fallback_ops() == []  # .item() is a sync there too, not a fallback

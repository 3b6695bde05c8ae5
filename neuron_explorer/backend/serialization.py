"""`torch.load(f, map_location="neuron")`: the device has no storages of its own (a neuron
tensor is a wrapper around a CPU payload, saved as that CPU tensor plus its device), so a
storage mapped to `neuron` stays the CPU storage it was read into and each tensor built on it is
moved to the device. torch's own path would build an `UntypedStorage` on the device, which a
storage-less backend cannot hold (it crashes the process), and first enters
`torch.neuron.device` (device_module.py). `ZeroRedundancyOptimizer.consolidate_state_dict`
loads the ranks' optimizer states this way."""

from __future__ import annotations

from typing import Any

import torch

_MARK = "_neuron_restore"  # set on a CPU storage that map_location sent to the device


def _tag(obj: Any) -> None:
    return None  # a neuron tensor is never saved on a neuron storage (tensor.__reduce_ex__)


def _restore(storage: Any, location: str) -> Any:
    if not location.startswith("neuron"):
        return None
    setattr(storage, _MARK, True)
    return storage


def _rebuild_on_device(original: Any) -> Any:
    def rebuild(storage: Any, storage_offset: int, size: Any, stride: Any) -> torch.Tensor:
        t = original(storage, storage_offset, size, stride)
        if getattr(storage._untyped_storage, _MARK, False):
            return t.to("neuron")
        return t

    rebuild._neuron = True  # type: ignore[attr-defined]
    return rebuild


def install() -> None:
    """Register the `neuron` location with torch.serialization (idempotent)."""
    if getattr(torch._utils._rebuild_tensor, "_neuron", False):
        return
    # before torch's own privateuse1 entry (priority 23), which would build a device storage
    torch.serialization.register_package(19, _tag, _restore)
    torch._utils._rebuild_tensor = _rebuild_on_device(torch._utils._rebuild_tensor)

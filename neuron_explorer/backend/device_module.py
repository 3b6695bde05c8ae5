"""`torch.neuron`: the device module, shaped like `torch.cuda` (one modeled NeuronCore)."""

from __future__ import annotations

import torch

_current_index = 0


def is_available() -> bool:
    """The modeled device is always there once the backend is registered."""
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1


def current_device() -> int:
    return _current_index


def set_device(device: int | str | torch.device) -> None:
    """Only neuron:0 exists; anything else is an error, as on a one-GPU CUDA machine."""
    index = torch.device(device).index if not isinstance(device, int) else device
    if index not in (None, 0):
        raise RuntimeError(f"neuron: invalid device ordinal {index} (device_count() is 1)")


class device:  # torch.cuda.device's name and shape
    """Context manager that selects a device, as `torch.cuda.device`: only neuron:0 exists, so
    it checks the index and selects nothing (torch's storage copies and `torch.load(...,
    map_location="neuron")` enter it)."""

    def __init__(self, device: int | str | torch.device | None) -> None:
        if device is not None and not (isinstance(device, int) and device < 0):
            set_device(device)
        self.idx = 0

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def get_device_name(device: int | None = None) -> str:
    from neuron_explorer.backend.runtime import model

    return f"NeuronCore ({model.spec_name()}, modeled)"


def synchronize(device: int | None = None) -> None:
    """Wait for all launched device work; a sync event when the profiler records."""
    from neuron_explorer.backend.runtime import dispatch

    dispatch.record_sync("torch.neuron.synchronize", None)


def manual_seed(seed: int) -> None:
    """The payload runs on the CPU generator, so seeding it keeps numerics equal to a CPU run."""
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    torch.default_generator.seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device: int | str = "neuron") -> torch.Tensor:
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: int | str = "neuron") -> None:
    torch.default_generator.set_state(new_state)


def get_fallback_ops() -> list[str]:
    """Ops that ran as CPU fallbacks since the last clear_op_tracking() (TorchNeuron's call)."""
    from neuron_explorer.backend.runtime import tracking

    return tracking.get_fallback_ops()


def get_executed_ops() -> list[str]:
    """Ops that launched device kernels since the last clear_op_tracking()."""
    from neuron_explorer.backend.runtime import tracking

    return tracking.get_executed_ops()


def clear_op_tracking() -> None:
    """Forget the executed and fallback ops recorded so far."""
    from neuron_explorer.backend.runtime import tracking

    tracking.clear_op_tracking()


# Autocast (torch.amp reads these hooks). Without a dtype, `torch.autocast("neuron")` takes
# torch 2.13's default for PrivateUse1, float16: pass dtype=torch.bfloat16, Trainium's type.


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled("neuron")


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype("neuron")


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# streams and events, as torch.cuda's (the device is one in-order queue: streams.py)
# memory, as torch.cuda's: `torch.neuron.memory` and its public names here too
from neuron_explorer.backend import device_memory as memory  # noqa: E402
from neuron_explorer.backend.device_memory import (  # noqa: E402
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from neuron_explorer.backend.streams import (  # noqa: E402
    Event,
    Stream,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

__all__ = ["Event", "Stream", "current_stream", "default_stream", "set_stream", "stream",
           "memory", "empty_cache", "max_memory_allocated", "max_memory_reserved",
           "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot",
           "memory_stats", "memory_summary", "reset_accumulated_memory_stats",
           "reset_max_memory_allocated", "reset_peak_memory_stats"]  # fmt: skip

"""The `neuron` device: a modeled AWS Trainium NeuronCore registered with PyTorch.

`import neuron_explorer.backend` registers the device (so does `import torch`, through the `torch.backends`
entry point). The public API is re-exported here; see docs/device.md.
"""

from __future__ import annotations

import sys as _sys
import types as _types


def _autoloading() -> bool:
    """True while torch's device-backend autoload imports us (an exception would break torch)."""
    frame: _types.FrameType | None = _sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_import_device_backends":
            return True
        frame = frame.f_back
    return False


try:
    # torch first: when this import comes before torch's (`from neuron_explorer.backend.costmodel
    # import ...` in a fresh process), torch's autoload hook then registers the device while no
    # runtime module of ours is half-imported (a circular import would leave it half-registered)
    import torch as _torch  # noqa: F401

    from neuron_explorer.backend._registration import is_registered, register
    from neuron_explorer.backend.custom_kernels import register_kernel
    from neuron_explorer.backend.runtime import events
    from neuron_explorer.backend.runtime.model import set_spec as set_device_spec
    from neuron_explorer.backend.runtime.ops import supported_ops
    from neuron_explorer.backend.runtime.shapes import shapes_only
    from neuron_explorer.backend.runtime.stats import compile_stats, reset_compile_stats
    from neuron_explorer.backend.runtime.tracking import (
        clear_op_tracking,
        get_executed_ops,
        get_fallback_ops,
    )

    if not _autoloading():
        register()
except Exception as _exc:
    if not _autoloading():
        raise
    import warnings as _warnings

    # torch turns any exception here into a failure of `import torch` itself
    _warnings.warn(f"neuron device not registered: {_exc!r}", RuntimeWarning, stacklevel=2)

__all__ = [
    "clear_op_tracking",
    "compile_stats",
    "events",
    "get_executed_ops",
    "get_fallback_ops",
    "is_registered",
    "register",
    "register_kernel",
    "reset_compile_stats",
    "set_device_spec",
    "shapes_only",
    "supported_ops",
]

"""Neuron Explorer: profile model, capture, importers, exporters, analysis and CLI."""

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy, so `import neuron_explorer` does not import torch
    if name in ("trace_handler", "profile"):
        from . import capture

        return getattr(capture, name)
    if name == "shapes_only":
        from .backend.runtime.shapes import shapes_only

        return shapes_only
    if name == "register_kernel":
        from .backend.custom_kernels import register_kernel

        return register_kernel
    raise AttributeError(f"module 'neuron_explorer' has no attribute {name!r}")

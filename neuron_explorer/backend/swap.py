"""`module.to("neuron")` while a CPU forward's autograd graph is alive.

A neuron parameter is a wrapper subclass, so `Module._apply` swaps the Python objects
(`torch.utils.swap_tensors`) where CUDA assigns `param.data`. The swap refuses a tensor that
the autograd graph also holds ("Couldn't swap Linear.weight"), which CUDA's `.data =` never
does. For a move between the host and the device the swap goes ahead here: the graph keeps the
old CPU tensor it saved, the module's parameter (the same Python object, as with `.data =`)
becomes the device tensor, and a backward through the old graph raises a clear error instead
of accumulating into a tensor no longer the parameter (CUDA raises a device mismatch there).
"""

from __future__ import annotations

from typing import Any

import torch

_plain_swap = None


def _poisoned(_grad_outputs: Any) -> Any:
    raise RuntimeError(
        "neuron: this backward runs through a graph recorded before the module moved to or "
        "from the neuron device; run the forward again after .to()"
    )


def _crosses_the_device(t1: torch.Tensor, t2: torch.Tensor) -> bool:
    from neuron_explorer.backend.tensor import NeuronTensor

    return isinstance(t1, NeuronTensor) != isinstance(t2, NeuronTensor)


def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
    """torch.utils.swap_tensors, which lets a graph-held tensor cross the host-device line."""
    assert _plain_swap is not None
    try:
        _plain_swap(t1, t2)
        return
    except RuntimeError as exc:
        if "use_count" not in str(exc) or not _crosses_the_device(t1, t2):
            raise
    if t1.is_leaf and t1.requires_grad:  # the old graph's accumulation point into t1
        torch.autograd.graph.get_gradient_edge(t1).node.register_prehook(_poisoned)
    t1.__class__, t2.__class__ = t2.__class__, t1.__class__
    t1.__dict__, t2.__dict__ = t2.__dict__, t1.__dict__
    torch._C._swap_tensor_impl(t1, t2)


def install() -> None:
    """Put the crossing swap where Module._apply looks it up (idempotent)."""
    global _plain_swap
    if _plain_swap is None:
        _plain_swap = torch.utils.swap_tensors
        torch.utils.swap_tensors = swap_tensors

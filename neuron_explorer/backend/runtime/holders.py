"""Who holds device memory: parameters, their gradients and optimizer state are tagged as such
(memory.tag) when the runtime first meets them, so the peak can say what held it.

No forward hooks (modules.py says why): a model's parameters are tagged when the runtime first
names its modules, each parameter's gradient as autograd accumulates it (a post-accumulate-grad
hook on the parameter), and an optimizer's parameters, gradients and state around each step
(torch.optim's global step hooks, which run once per step, not per op).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

from neuron_explorer.backend.runtime import memory, modules

# id -> weak reference of each parameter whose gradients are tagged (by id: a WeakSet compares
# its members with ==, elementwise for tensors, when a tied weight is met a second time)
_hooked: dict[int, weakref.ref] = {}
_handles: list[Any] = []


def _tag_grad(param: torch.Tensor) -> None:
    if param.grad is not None:
        memory.tag(param.grad, "gradients")


def _forget(key: int, _ref: object) -> None:
    _hooked.pop(key, None)


def tag_module(module: torch.nn.Module) -> None:
    """Tag `module`'s own parameters, and their gradients once autograd makes them."""
    for p in module._parameters.values():
        if p is None or p.device.type != "neuron":
            continue
        memory.tag(p, "parameters")
        key = id(p)
        known = _hooked.get(key)
        if p.requires_grad and (known is None or known() is not p):
            _hooked[key] = weakref.ref(p, functools.partial(_forget, key))
            p.register_post_accumulate_grad_hook(_tag_grad)


def _before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            memory.tag(p, "parameters")
            if p.grad is not None:
                memory.tag(p.grad, "gradients")


def _after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                memory.tag(v, "optimizer state")


def install() -> None:
    """Register the optimizer step hooks and the module naming's callback once per process."""
    if _handles:
        return
    modules.ON_NAMED.append(tag_module)
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    _handles.append(register_optimizer_step_pre_hook(_before_step))
    _handles.append(register_optimizer_step_post_hook(_after_step))

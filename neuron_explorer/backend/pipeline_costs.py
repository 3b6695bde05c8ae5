"""What the copies of a modeled pipeline's later stages compute and stage 0 does not
(backend/pipeline_ranks.py), priced by the cost model: stage 0's module run again on meta
tensors of its own shapes, each op it dispatches priced as the device would launch it.

- **The input's gradient.** Stage 0's input needs no gradient; a later stage's does, so its
  backward runs more kernels: a matmul's `grad @ W`, a bmm's, and the elementwise backward of
  any op between the input and the first parameter (which on stage 0 records no autograd node
  at all). `input_grad_ns` is the backward with the input needing a gradient less the one
  without: only what stage 0 really skipped.
- **The last stage's loss.** The schedule's `loss_fn` on each micro-batch's output, forward
  and backward (from `ones_like` of the loss, as autograd starts it), the target taken as a
  tensor of the output's shape and dtype; and the merge of the micro-batches' outputs that
  the last stage's `step` returns.
- **The adding of gradients** to those an earlier micro-batch left (`accumulate_ns`), on the
  tensors autograd really adds into: a parameter's `.grad` (a DTensor's local shard), or, for
  a parameter FSDP2 shards (`fully_shard`), its unsharded gradient, which a pipeline stage's
  backwards accumulate without reduce-scattering (`set_requires_gradient_sync(False)`; the
  schedule reduces once after the last): an `add_` of the unsharded size, and with a
  `reduce_dtype` other than the parameters' the first micro-batch's cast to it and the later
  ones' `+=` into that copy.

Stage 0's module is priced without FSDP2's hooks (no all-gather on meta tensors): its
parameters at their unsharded shapes, in the dtype FSDP2 computes in (`param_dtype`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class _Priced(TorchDispatchMode):
    """Runs each op on its meta tensors and adds up its kernel's modeled time on an idle
    device; views and the ops that launch no kernel (runtime/ops.py) cost nothing, as on the
    device."""

    def __init__(self) -> None:
        super().__init__()
        self.ns = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from neuron_explorer.backend.costmodel import lower_op
        from neuron_explorer.backend.runtime import model, ops

        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if not func.is_view and name not in ops.NO_KERNEL:
            ins, outs = _infos((args, kwargs)), _infos(out)
            self.ns += plan_ns(lower_op(name, ins, outs, model.spec()))
        return out


def _infos(tree: Any) -> list[Any]:
    """The tensors of an op's arguments or results as the cost model sees them, as
    runtime/record.py describes a payload (which imports this module through the
    collectives): float64 computed as float32, a column-major matrix transposed."""
    from neuron_explorer.backend.costmodel import TensorInfo

    return [
        TensorInfo(tuple(t.shape), "float32" if t.dtype is torch.float64 else dtype_name(t.dtype),
                   t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) > 1 and t.shape[-2] > 1)
        for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)
    ]  # fmt: skip


@contextlib.contextmanager
def _off_the_record() -> Iterator[None]:
    """Neither torch.profiler nor the modeled host clock sees the pricing: it is the
    simulator's own work (its real time is cut, as a runtime call's is)."""
    from neuron_explorer.backend.runtime import model

    begin = time.time_ns()
    torch.autograd._enable_record_function(False)
    try:
        yield
    finally:
        torch.autograd._enable_record_function(True)
        model.add_cut(time.time_ns() - begin, 0)


def _meta(t: torch.Tensor, grad: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
    out = torch.empty_strided(tuple(t.shape), t.stride(), dtype=dtype or t.dtype, device="meta")
    return out.requires_grad_(grad)


def _fsdp_params(module: Any) -> list[Any]:
    """The parameters FSDP2 manages in `module` (its FSDPParams), none without FSDP2."""
    from torch.distributed.fsdp import FSDPModule

    return [fp for m in module.modules() if isinstance(m, FSDPModule)
            for group in m._get_fsdp_state()._fsdp_param_groups for fp in group.fsdp_params]  # fmt: skip


def _compute_dtype(fp: Any) -> torch.dtype:
    """The dtype FSDP2 runs a parameter in: its policy's `param_dtype` (set on first use)."""
    return getattr(fp, "param_dtype", None) or fp.sharded_param.dtype


@contextlib.contextmanager
def _without_fsdp_hooks(module: Any) -> Iterator[None]:
    """`module` run as the plain module FSDP2 wraps: its forward hooks (all-gathers, casts,
    the backward's reduce-scatters) off while the meta copy runs."""
    from torch.distributed.fsdp import FSDPModule

    saved = []
    for m in module.modules():
        if isinstance(m, FSDPModule) and isinstance(m, torch.nn.Module):
            for hooks in (m._forward_pre_hooks, m._forward_hooks):
                saved.append((hooks, dict(hooks)))
                hooks.clear()
    try:
        yield
    finally:
        for hooks, items in saved:
            hooks.update(items)


def _backward_ns(module: Any, args: Any, input_grad: bool) -> int:
    """The modeled kernels of `module`'s backward on meta copies of `args` (a stage's
    positional and keyword inputs), its inputs needing a gradient or not."""
    dtypes = {id(fp.sharded_param): _compute_dtype(fp) for fp in _fsdp_params(module)}
    state = {n: _meta(p, p.requires_grad, dtypes.get(id(p))) for n, p in module.named_parameters()}
    state.update({n: _meta(b) for n, b in module.named_buffers()})
    cast = next(iter(dtypes.values()), None)  # FSDP2 casts the stage's float inputs to it

    def meta_input(t: torch.Tensor) -> torch.Tensor:
        floating = t.is_floating_point()
        return _meta(t, input_grad and floating, cast if floating else None)

    inputs = pytree.tree_map_only(torch.Tensor, meta_input, args)
    with _without_fsdp_hooks(module):
        called = torch.func.functional_call(module, state, *inputs)
    outs = [o for o in pytree.tree_leaves(called)
            if isinstance(o, torch.Tensor) and o.requires_grad]  # fmt: skip
    wrt = [t for t in (*state.values(), *pytree.tree_leaves(inputs))
           if isinstance(t, torch.Tensor) and t.requires_grad]  # fmt: skip
    if not outs or not wrt:
        return 0
    grads = [torch.empty_like(o) for o in outs]  # what the next stage sends: no kernel here
    with _Priced() as priced:
        torch.autograd.grad(outs, wrt, grads, allow_unused=True)
    return priced.ns


def input_grad_ns(module: Any, args: Any, kwargs: Any) -> int:
    """The modeled kernels a later stage's backward adds to stage 0's (same module, same
    shapes): those of its input's gradient, which stage 0's input does not need."""
    with _off_the_record():
        both = [_backward_ns(module, (args, kwargs), grad) for grad in (True, False)]
    return max(0, both[0] - both[1])


def loss_ns(loss_fn: Any, out: Any, merge: Any = None, n_microbatches: int = 0) -> tuple:
    """(forward, backward, merge): the modeled kernels of `loss_fn` on one micro-batch's
    output `out` of the last stage, against a target of its shape and dtype, and of merging
    `n_microbatches` such outputs with the schedule's `merge` (`merge_chunks`); 0 for what
    cannot be priced (no loss_fn, one that refuses such a target)."""
    if loss_fn is None or not isinstance(out, torch.Tensor):
        return 0, 0, 0
    with _off_the_record():
        output = _meta(out, True)
        with _Priced() as forward:
            loss = loss_fn(output, _meta(out))
        with _Priced() as backward:
            torch.autograd.grad(loss, output)
        merged = 0
        if merge is not None and n_microbatches > 1:
            with _Priced() as merging:
                merge([_meta(out) for _ in range(n_microbatches)])
            merged = merging.ns
    return forward.ns, backward.ns, merged


def accumulate_ns(module: Any) -> int:
    """The modeled adds of a backward's gradients to those an earlier micro-batch left, as
    `module`'s gradients stand before it: autograd's AccumulateGrad, one `add_` for each
    parameter holding a gradient (a DTensor's on its local shard); for a parameter FSDP2
    shards, on its unsharded gradient, or (a `reduce_dtype` of its own) the cast of the first
    micro-batch's to it and the `+=` of the later ones' into that copy."""
    from neuron_explorer.backend.costmodel import TensorInfo, lower_op
    from neuron_explorer.backend.runtime import model

    def info(t: Any, dtype: Any = None) -> Any:
        return TensorInfo(tuple(t.shape), dtype_name(dtype or t.dtype))

    def priced(op: str, ins: tuple, out: Any) -> int:
        return plan_ns(lower_op(op, ins, (out,), model.spec()))

    total, sharded = 0, set[int]()
    for fp in _fsdp_params(module):
        unsharded = getattr(fp, "_unsharded_param", None)
        sharded.update((id(fp.sharded_param), id(unsharded)))  # either is the module's now
        if unsharded is None or not unsharded.requires_grad:
            continue
        new, accumulated = info(unsharded), fp.unsharded_accumulated_grad
        if accumulated is not None:  # post_backward's `+=` of the new gradient into it
            total += priced("aten::add_", (info(accumulated), new), info(accumulated))
        elif unsharded.grad is not None:
            total += priced("aten::add_", (new, new), new)
        elif fp.reduce_dtype is not None and fp.reduce_dtype != unsharded.dtype:
            total += priced("aten::_to_copy", (new,), info(unsharded, fp.reduce_dtype))
    for p in module.parameters():
        if p.requires_grad and p.grad is not None and id(p) not in sharded:
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            total += priced("aten::add_", (info(grad), info(grad)), info(grad))
    return total


def dtype_name(dtype: Any) -> str:
    """A torch dtype as the cost model names it (as runtime/record.py does)."""
    return str(dtype).removeprefix("torch.")


def plan_ns(plan: Any) -> int:
    """A kernel plan's modeled time on an idle device."""
    starts, _, begin, end = plan.idle_schedule
    return int(end - begin) if starts else 0

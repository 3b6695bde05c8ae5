"""Uniform routing in shapes-only mode: the expected fill of a one-hot mask.

An MoE layer that picks each expert's tokens from a one-hot mask (Transformers' eager experts:
`one_hot(top_k_index, experts)`, then `torch.where(mask[expert])`) asks `nonzero` for a shape
that depends on the routing. A data-less payload has no routing, so it takes uniform routing:
each index equally likely to be each class, so 1/classes of a one-hot mask's elements are set
and every class gets `tokens * top_k / classes` of them. The fill starts at the comparison that
makes the mask (one_hot's `index == arange(classes)`, or `aten::one_hot` whole), is carried on
the meta payload through views, casts and comparisons with zero, and through a sum over n
elements becomes `1 - (1 - fill) ** n` (the chance that a class was picked at all: the experts
hit); `nonzero` and boolean masks then keep that fill of their elements (shapes.py) instead of
the default fill ratio (docs/device.md, "Shapes-only mode").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

ATTR = "_neuron_fill"  # on a meta payload: the expected fraction of its elements set

# ops whose output holds the same fraction of nonzero elements as their first input
_KEEP = frozenset({
    "aten::permute", "aten::select", "aten::slice", "aten::view", "aten::_unsafe_view",
    "aten::reshape", "aten::expand", "aten::transpose", "aten::t", "aten::unsqueeze",
    "aten::squeeze", "aten::_to_copy", "aten::clone", "aten::alias", "aten::detach",
    "aten::unbind", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::flatten",
    "aten::contiguous", "aten::_reshape_alias", "aten::lift_fresh",
})  # fmt: skip
# comparisons that keep what is nonzero nonzero when the other operand is zero (counts > 0)
_WITH_ZERO = frozenset({"aten::gt", "aten::ne"})
# reductions: a class is set in the result when any of the n elements summed was
_REDUCE = frozenset({"aten::sum", "aten::any", "aten::amax"})
RULES = _KEEP | _WITH_ZERO | _REDUCE | {"aten::eq", "aten::one_hot"}


def fill_of(t: Any) -> float | None:
    """The expected fill of a meta payload that came from a one-hot mask, else None."""
    return getattr(t, ATTR, None) if type(t) is torch.Tensor else None


def carry(src: Any, out: Any) -> None:
    """Give `out` the fill of `src` (a cast of it), if it has one."""
    fill = fill_of(src)
    if fill is not None:
        _tag(out, fill)


def _tag(out: Any, fill: float) -> None:
    if type(out) is torch.Tensor and out.device.type == "meta":
        setattr(out, ATTR, fill)
    elif isinstance(out, (list, tuple)):
        for o in out:
            _tag(o, fill)


def _one_hot(a: Any, b: Any, out: Any) -> float | None:
    """`index == classes` broadcast into a one-hot mask: the larger operand (the indices) is
    broadcast over the class dims, and the smaller holds each of those classes once."""
    if not all(type(t) is torch.Tensor for t in (a, b, out)):
        return None
    if a.is_floating_point() or b.is_floating_point() or a.dtype is torch.bool:
        return None
    big, small = (a, b) if a.numel() >= b.numel() else (b, a)
    shape = out.shape
    big_shape = (1,) * (len(shape) - big.dim()) + tuple(big.shape)
    classes = math.prod(n for n, m in zip(shape, big_shape, strict=True) if m == 1 and n > 1)
    return 1.0 / classes if classes > 1 and small.numel() == classes else None


def _propagate(name: str, args: tuple, kwargs: dict, out: Any) -> None:
    first = args[0] if args else None
    if name == "aten::eq":
        fill = _one_hot(first, args[1] if len(args) > 1 else None, out)
    elif name == "aten::one_hot":
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        fill = 1.0 / classes if isinstance(classes, int) and classes > 1 else None
    else:
        fill = fill_of(first)
        if fill is None:
            return
        if name in _WITH_ZERO and not (len(args) > 1 and args[1] == 0):
            return
        if name in _REDUCE and type(out) is torch.Tensor and type(first) is torch.Tensor:
            summed = first.numel() // max(out.numel(), 1)
            fill = 1.0 - (1.0 - fill) ** summed
    if fill is not None:
        _tag(out, fill)


def carrying_fill(name: str, call: Callable) -> Callable:
    """`call` that carries a one-hot mask's fill from its meta inputs to its outputs (op `name`
    is in RULES); a CPU payload passes through untouched."""

    def run(*args: Any, **kwargs: Any) -> Any:
        out = call(*args, **kwargs)
        if type(out) is torch.Tensor and out.device.type != "meta":
            return out
        _propagate(name, args, kwargs, out)
        return out

    run._carries_fill = True  # type: ignore[attr-defined]
    return run

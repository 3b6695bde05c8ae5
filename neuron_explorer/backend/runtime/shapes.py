"""Shapes-only mode: neuron tensors whose payloads are meta tensors (shape, dtype and strides,
no data), so a model of any size is built, run, stepped and profiled in a memory that does not
grow with its parameter count (docs/device.md, "Shapes-only mode").

Every op still takes the same path (the wrapper, the compile cache, the lowering, the recorded
launch, the device timeline): only the payload op runs on the meta device instead of the CPU.
What needs values gets a documented answer, with one warning per user line: `.item()`,
`.tolist()`, `.cpu()`, printing and the comparisons that read a value return a placeholder of
zeros; an op whose output shape depends on values (`nonzero`, a boolean mask, `unique`,
`masked_select`) assumes a fill ratio, `FILL_RATIO` of its elements kept, or uniform routing
where it reads a one-hot mask (routing.py), and the profile's manifest states it
(`manifest()`).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from neuron_explorer.backend.runtime import routing

ENV = "NEURON_EXPLORER_SHAPES_ONLY"
FILL_ENV = "NEURON_EXPLORER_SHAPES_FILL"
DOCS = "docs/device.md#shapes-only-mode"


def _fill_ratio() -> float:
    raw = os.environ.get(FILL_ENV, "")
    try:
        value = float(raw) if raw else 0.5
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{FILL_ENV}={raw!r}: expected a fraction between 0 and 1")
    return value


# New payloads are meta tensors while ON (the environment variable, or the context manager)
ON = os.environ.get(ENV, "") not in ("", "0")
# True once any meta payload was made in this process: payload.run_payload then calls ops
# through the dispatcher (to their Meta kernels), never redispatches straight to a CPU kernel
SEEN = ON
# the fraction of a data-dependent op's elements assumed kept (nonzero, boolean masks, unique)
FILL_RATIO = _fill_ratio()
_META = torch.device("meta")
_CPU = torch.device("cpu")
_lock = threading.Lock()
_assumed: dict[str, int] = {}  # op -> calls whose output shape was assumed
_uniform: dict[str, int] = {}  # op -> calls that read a one-hot mask: uniform routing
_placeholders: dict[str, int] = {}  # what asked for values (".item()", print) -> calls
_first_use: list[Callable[[], None]] = []  # run when SEEN first turns True
_warned: set[tuple[str, int]] = set()  # (file, line): one warning per user line


def enabled() -> bool:
    """True while new neuron tensors are made without data."""
    return ON


def payload_device() -> torch.device:
    """Where a new payload lives: the meta device in shapes-only mode, else the CPU."""
    return _META if ON else _CPU


def set_enabled(on: bool) -> bool:
    """Turn the mode on or off for tensors made from now on; returns the previous setting."""
    global ON, SEEN
    was, first = ON, on and not SEEN
    ON = on
    SEEN = SEEN or on
    if first:
        for hook in _first_use:
            hook()
    return was


def on_first_use(hook: Callable[[], None]) -> None:
    """Run `hook` once the mode is first on in this process (now, where it was already)."""
    if SEEN:
        hook()
    else:
        _first_use.append(hook)


@contextlib.contextmanager
def shapes_only(on: bool = True) -> Iterator[None]:
    """Within the block, neuron tensors carry shape, dtype and strides but no data; tensors
    made inside stay data-less after it."""
    was = set_enabled(on)
    try:
        yield
    finally:
        set_enabled(was)


def is_meta(t: Any) -> bool:
    return type(t) is torch.Tensor and t.device.type == "meta"


def _count(table: dict[str, int], key: str) -> None:
    with _lock:
        table[key] = table.get(key, 0) + 1


def _warn(message: str) -> None:
    """Warn once per user line, pointing at it (several placeholders on one line: one warning)."""
    from neuron_explorer.backend.runtime.source import user_frame

    where = user_frame(3)
    key = (where[0], where[1]) if where is not None else ("", 0)
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    if where is None:
        warnings.warn(message, UserWarning, stacklevel=4)
    else:
        warnings.warn_explicit(message, UserWarning, where[0], where[1])


def placeholder(what: str) -> None:
    """`what` (".item()", "print", ".tolist()") asked a data-less tensor for its values."""
    _count(_placeholders, what)
    _warn(
        f"neuron: shapes-only mode: {what} of a tensor with no data returns a placeholder "
        f"(zeros); the run goes on with it ({DOCS})"
    )


def scalar(p: torch.Tensor) -> Any:
    """The placeholder value of `.item()`: zero of the tensor's dtype."""
    placeholder(".item()")
    if p.dtype is torch.bool:
        return False
    if p.dtype.is_complex:
        return 0j
    return 0.0 if p.dtype.is_floating_point else 0


def host_copy(p: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The placeholder of a device-to-host copy of a data-less payload: CPU zeros."""
    placeholder(".cpu()")
    return torch.zeros(p.shape, dtype=dtype or p.dtype)


def repr_of(shape: torch.Size, dtype: torch.dtype, device: Any) -> str:
    placeholder("print")
    return f"tensor(<no data: shapes-only>, size={tuple(shape)}, dtype={dtype}, device='{device}')"


# ---- ops whose output shape depends on values -----------------------------------------------


def _kept(n: int, fill: float | None = None) -> int:
    return min(n, math.ceil(n * (FILL_RATIO if fill is None else fill)))


def _assume(name: str, mask: Any = None) -> float | None:
    """Count and warn an assumed output shape of op `name`; the fill it takes: a one-hot
    mask's uniform-routing fill (routing.py) where `mask` came from one, else None (the
    default fill ratio)."""
    fill = routing.fill_of(mask)
    if fill is not None:
        _count(_uniform, name)
        _warn(
            f"neuron: shapes-only mode: {name} of a one-hot mask assumes uniform routing: "
            f"{fill:.3g} of its elements set ({DOCS})"
        )
        return fill
    _count(_assumed, name)
    _warn(
        f"neuron: shapes-only mode: {name}'s output shape depends on values; assumed "
        f"{FILL_RATIO:g} of its elements kept ({FILL_ENV}; {DOCS})"
    )
    return None


def _nonzero(name: str, call: Callable) -> Callable:
    def run(self, *args, **kwargs):
        if not is_meta(self):
            return call(self, *args, **kwargs)
        fill = _assume(name, self)
        kept = _kept(self.numel(), fill)
        return torch.empty((kept, self.dim()), dtype=torch.long, device=_META)

    return run


def _masked_select(name: str, call: Callable) -> Callable:
    def run(self, mask, *args, **kwargs):
        if not is_meta(self):
            return call(self, mask, *args, **kwargs)
        fill = _assume(name, mask)
        n = torch.broadcast_shapes(self.shape, mask.shape).numel()
        return torch.empty((_kept(n, fill),), dtype=self.dtype, device=_META)

    return run


def _unique(name: str, call: Callable) -> Callable:
    def run(self, *args, **kwargs):
        if not is_meta(self):
            return call(self, *args, **kwargs)
        _assume(name)
        values = torch.empty((_kept(self.numel()),), dtype=self.dtype, device=_META)
        inverse = torch.empty(self.shape, dtype=torch.long, device=_META)
        counts = torch.empty(values.shape, dtype=torch.long, device=_META)
        return values, inverse, counts

    return run


def _long_indices(indices: Any, fill: float | None) -> Any:
    """Boolean masks among index tensors as the long indices of their assumed kept elements
    (torch's own meta kernel of a masked index asks for the mask's values)."""
    out: list = []
    for ix in indices:
        if is_meta(ix) and ix.dtype in (torch.bool, torch.uint8):
            n = _kept(ix.numel(), fill)
            out.extend(torch.empty((n,), dtype=torch.long, device=_META) for _ in range(ix.dim()))
        else:
            out.append(ix)
    return out


def _masked_index(name: str, call: Callable) -> Callable:
    def run(self, indices, *args, **kwargs):
        masks = [ix for ix in indices if is_meta(ix) and ix.dtype in (torch.bool, torch.uint8)]
        if is_meta(self) and masks:
            indices = _long_indices(indices, _assume(name, masks[0]))
        return call(self, indices, *args, **kwargs)

    return run


def _as_bf16(name: str, call: Callable) -> Callable:
    """An op whose Meta kernel takes only bf16 where the CPU's takes any float (grouped_mm, the
    MoE experts' matmul in Transformers): its shape computed as bf16, its dtype kept."""

    def run(*args, **kwargs):
        first = args[0] if args else None
        if not is_meta(first) or first.dtype is torch.bfloat16:
            return call(*args, **kwargs)
        dtype = first.dtype
        wide = [a.to(torch.bfloat16) if is_meta(a) and a.is_floating_point() else a for a in args]
        return call(*wide, **{k: v for k, v in kwargs.items() if k != "out_dtype"}).to(dtype)

    return run


DATA_DEPENDENT: dict[str, Callable[[str, Callable], Callable]] = {
    "aten::_grouped_mm": _as_bf16,
    "aten::nonzero": _nonzero,
    "aten::masked_select": _masked_select,
    "aten::_unique2": _unique,
    "aten::unique_consecutive": _unique,
    "aten::index": _masked_index,
    "aten::index_put": _masked_index,
    "aten::index_put_": _masked_index,
    "aten::_index_put_impl_": _masked_index,
}


def data_dependent(name: str, call: Callable) -> Callable | None:
    """`call` with the shapes-only assumption for op `name` (or its Meta kernel's dtype rule
    relaxed), or None where a meta payload needs nothing of it."""
    make = DATA_DEPENDENT.get(name)
    return None if make is None else make(name, call)


def manifest() -> dict[str, Any] | None:
    """What a profile of this process must say about the mode, or None where it was never on:
    the assumptions data-dependent shapes took and the placeholders values were given."""
    if not SEEN:
        return None
    with _lock:
        return {
            "fill_ratio": FILL_RATIO,
            "fill_ratio_source": FILL_ENV if os.environ.get(FILL_ENV) else "default",
            "assumed_shapes": dict(sorted(_assumed.items())),
            "uniform_routing": dict(sorted(_uniform.items())),
            "placeholders": dict(sorted(_placeholders.items())),
            "numerics": "none: tensors carry shapes, dtypes and strides, no values",
        }

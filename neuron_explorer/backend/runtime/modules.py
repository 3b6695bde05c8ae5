"""nn.Module paths, as `model.named_modules()` names them, for the module whose forward runs.

The frame walk (source.call_site) finds the innermost `Module.__call__` frame and its `self`;
here that module gets its path. The first time a module is seen, the outermost module on the
stack (the model the user called) is named with `named_modules()`, so every submodule gets
its dotted path (`transformer.h.0.attn.c_attn`) and the model itself the empty path, as
named_modules gives it. A module outside that tree (made on the fly) is named by its class.
No forward hooks: global module hooks make dynamo break graphs and slow every module call.
"""

from __future__ import annotations

import weakref

import torch

WRAPPED_CALL = torch.nn.Module._wrapped_call_impl.__code__
# id(module) -> (weak reference to the module, path): a model the user deletes is collected
# (its entries go with it), and an id reused by a new module never matches the dead reference
_paths: dict[int, tuple[weakref.ref, str]] = {}
ORIG_MOD = "_orig_mod"  # torch.compile's OptimizedModule holds the module it compiles here
# called with each module the first time it is named (holders.py tags its parameters): a list
# the layer above fills, as this module sits below memory accounting in the import order
ON_NAMED: list = []


def _remember(module, path: str) -> None:
    key = id(module)

    def gone(_ref, key=key) -> None:
        entry = _paths.get(key)
        if entry is not None and entry[0] is _ref:
            del _paths[key]

    _paths[key] = (weakref.ref(module, gone), path)


def _known(module) -> str | None:
    entry = _paths.get(id(module))
    return entry[1] if entry is not None and entry[0]() is module else None


def path_of(module, frame) -> str:
    """The path of `module`, running in `frame`'s stack."""
    entry = _paths.get(id(module))
    if entry is not None and entry[0]() is module:
        return entry[1]
    return _name(module, frame)


def _outermost(frame):
    root = None
    while frame is not None:
        if frame.f_code is WRAPPED_CALL:
            root = frame.f_locals.get("self")
        frame = frame.f_back
    return root


def _name(module, frame) -> str:
    root = _outermost(frame)
    # torch.compile's wrapper: name the model it wraps (dynamo's nn_module_stack names modules
    # from the model too), never "_orig_mod.blocks.0"
    inner = getattr(root, ORIG_MOD, None)
    if isinstance(inner, torch.nn.Module):
        _remember(root, "")
        root = inner
    if isinstance(root, torch.nn.Module):
        for name, m in root.named_modules():
            if _known(m) is None:
                _remember(m, without_wrappers(name))
                for seen in ON_NAMED:
                    seen(m)
    known = _known(module)
    if known is not None:
        return known
    path = type(module).__name__
    _remember(module, path)
    return path


def without_wrappers(path: str) -> str:
    """A path without torch.compile's wrapper of a submodule compiled alone
    (`model._orig_mod.h.0` -> `model.h.0`): the name the model gives it."""
    return ".".join(p for p in path.split(".") if p != ORIG_MOD)


def forget() -> None:
    """Drop every name (tests; a model deleted and rebuilt gets named afresh anyway)."""
    _paths.clear()

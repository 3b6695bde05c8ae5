"""Call sites of compiled kernels: each FX node's whole stack (`node.meta["stack_trace"]`) and
module path (`nn_module_stack`, or `fwd_nn_module_stack` on backward nodes), joined at run
time to the live stack of the program's launch (the user's call of the compiled model)."""

from __future__ import annotations

import re

from neuron_explorer.backend.runtime import source

_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# dynamo names module paths from the compiled frame's locals or globals: L['self'].h[0].attn,
# L['self']._modules['x'], L['model'].h[0] (a function given the model), L['args'][0].h[0]
# (given it in *args), G['model'].h[0] (calling a global); the root is the module called
_KEY = r"""(?:'[^']*'|"[^"]*"|\d+)"""
_ROOT = re.compile(rf"^(?:[LG]\[{_KEY}\](?:\[{_KEY}\])*|self)\.?")
_INDEX = re.compile(r"\[(?:'([^']*)'|\"([^\"]*)\"|(\d+))\]")
_combined: dict[tuple, tuple[int, str | None]] = {}


def module_path(dynamo_path: str) -> str:
    """`L['self'].blocks[0].attn` -> `blocks.0.attn`, as named_modules() names it under the
    module the compiled frame called."""
    p = "." + _ROOT.sub("", dynamo_path, count=1)
    p = _INDEX.sub(lambda m: "." + (m[1] or m[2] or m[3]), p).replace("._modules.", ".")
    return p.lstrip(".")


def node_site(node) -> tuple[tuple, str | None]:
    """(frames innermost first, module path) of one FX node; our own frames dropped."""
    frames = []
    for file, line, func in reversed(_LINE.findall(node.meta.get("stack_trace") or "")):
        scope = source.scope_of_file(file)
        if scope:
            frames.append((file, int(line), func, source.SCOPE_NAMES[scope]))
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    module = None
    if stack:
        path = list(stack.values())[-1]
        module = module_path(str(path[0] if isinstance(path, tuple) else path))
    return tuple(frames), module


def site(node_site_: tuple[tuple, str | None], launch: tuple[int, str | None]):
    """(stack id, module) of a kernel: its node's frames, then the launch's frames outside torch
    (the dynamo and AOTAutograd machinery between the user's call and the graph is dropped)."""
    key = (id(node_site_), launch[0])
    out = _combined.get(key)
    if out is None:
        frames, module = node_site_
        outer = source.STACKS[launch[0]] if launch[0] >= 0 else ()
        tail = tuple(f for f in outer if f[3] != "torch")
        out = (source.intern_frames(frames + tail), _joined(launch[1], module))
        _combined[key] = out
        _keep.append(node_site_)  # its id is a key: keep it alive
    return out


_keep: list = []


def _joined(outer: str | None, inner: str | None) -> str | None:
    """A node's module path (relative to the module the compiled frame called) under the path
    of the module running at the launch (that called module, in the model the user called):
    a model compiled as a submodule keeps its place, as eager names it (`model.h.0`, not
    `h.0`)."""
    if inner is None:
        return outer
    return ".".join(p for p in (outer, inner) if p)

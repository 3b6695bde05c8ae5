"""Call sites of compiled kernels: each FX node's whole stack (`node.meta["stack_trace"]`) and
module path (`nn_module_stack`, or `fwd_nn_module_stack` on backward nodes), joined at run
time to the live stack of the program's launch (the user's call of the compiled model)."""

from __future__ import annotations

import re

from neuron_explorer.backend.runtime import source

_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# dynamo names module paths from its frame's locals: L['self'].h[0].attn, L['self']._modules['x']
_ROOT = re.compile(r"^(L\['self'\]|L\[\"self\"\]|self)\.?")
_INDEX = re.compile(r"\[(?:'([^']*)'|\"([^\"]*)\"|(\d+))\]")
_combined: dict[tuple, tuple[int, str | None]] = {}


def module_path(dynamo_path: str) -> str:
    """`L['self'].blocks[0].attn` -> `blocks.0.attn`, as named_modules() names it."""
    p = _ROOT.sub("", dynamo_path, count=1)
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
        out = (source.intern_frames(frames + tail), module if module is not None else launch[1])
        _combined[key] = out
        _keep.append(node_site_)  # its id is a key: keep it alive
    return out


_keep: list = []

"""Where a runtime call came from: its whole Python stack (interned) and the innermost user frame.

A frame's scope is decided once per code object, by the PATH of its file (vocab/frames.py: our
own package, never a frame; torch, whose profiler's own frames are dropped like ours; the
standard library; a library; else the user's). See docs/format.md.
"""

from __future__ import annotations

import sys
from types import FrameType

from neuron_explorer.backend.runtime import modules
from neuron_explorer.vocab import frames

OWN, TORCH, STDLIB, LIBRARY, USER = 0, 1, 2, 3, 4
SCOPE_NAMES = {TORCH: "torch", STDLIB: "stdlib", LIBRARY: "library", USER: "user"}
# the vocabulary's scopes as codes: ours and torch.profiler's frames are never kept (0)
_CODES = {frames.OWN: OWN, frames.PROFILER: OWN, frames.TORCH: TORCH, frames.STDLIB: STDLIB,
          frames.LIBRARY: LIBRARY, frames.USER: USER}  # fmt: skip

# Decisions by id(code): hashing a code object hashes its bytecode and constants every time
# (CPython does not cache it), microseconds per frame; `_seen` keeps each code alive so that
# no id is reused while it is a key.
_scope: dict[int, int] = {}
_seen: list = []
_user_ids: set[int] = set()
_library_ids: set[int] = set()
# Interned stacks: key (id(code), f_lasti, ...) innermost first -> stack id; per id its frames.
_stack_ids: dict[tuple, int] = {}
STACKS: list[tuple[tuple[str, int, str, str], ...]] = []  # (file, line, function, scope)
_by_frames: dict[tuple, int] = {}
USER_FRAME: list[tuple[str, int, str] | None] = []  # per stack id: innermost user frame
_WRAPPED_CALL = modules.WRAPPED_CALL


def scope_of_file(filename: str) -> int:
    """The scope of a source file, by its path (vocab/frames.py; OWN for ours and torch.profiler's)."""
    return _CODES[frames.scope_of(filename)]


def is_user_file(filename: str) -> bool:
    """True for a user's file: not torch, ours, the stdlib or an installed library."""
    return scope_of_file(filename) == USER


def _learn(code) -> int:
    _seen.append(code)
    s = _scope[id(code)] = scope_of_file(code.co_filename)
    return s


def call_site(depth: int = 2) -> tuple[int, str | None]:
    """(stack id, module path) of the caller `depth` frames up: the interned stack of every
    frame but ours, and the nn.Module path of the innermost module whose forward runs."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return -1, None
    scope = _scope
    key: list = []
    add = key.append
    module = None
    f: FrameType | None = frame
    while f is not None:
        code = f.f_code
        c = id(code)  # once: a builtin call per frame, on every recorded op's whole stack
        s = scope.get(c)
        if s is None:
            s = _learn(code)
        if s:
            add(c)
            # the instruction offset, not f_lineno: CPython computes a line by scanning the
            # code's line table (microseconds in a long function such as Module._call_impl);
            # the line is read once, when a new stack is interned
            add(f.f_lasti)
            if module is None and code is _WRAPPED_CALL:
                module = f.f_locals.get("self")
        f = f.f_back
    k = tuple(key)
    sid = _stack_ids.get(k)
    if sid is None:
        sid = _intern_live(k, frame)
    return sid, (modules.path_of(module, frame) if module is not None else None)


def _intern_live(key: tuple, frame) -> int:
    frames = []
    f = frame
    while f is not None:
        code = f.f_code
        s = _scope[id(code)]
        if s:
            frames.append((code.co_filename, f.f_lineno, code.co_name, SCOPE_NAMES[s]))
        f = f.f_back
    return intern_frames(tuple(frames), key)


def intern_frames(frames: tuple[tuple[str, int, str, str], ...], key: tuple | None = None) -> int:
    """The stack id of `frames` (innermost first), interning it on first sight; live keys
    that differ only by instruction offsets on the same lines share one id."""
    sid = _by_frames.get(frames)
    if sid is None:
        sid = _by_frames[frames] = len(STACKS)
        STACKS.append(frames)
        USER_FRAME.append(next(((f, n, fn) for f, n, fn, s in frames if s == "user"), None))
    if key is not None:
        _stack_ids[key] = sid
    return sid


def user_frame(depth: int = 2) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost user frame (outside torch, ours and libraries)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    library, users = _library_ids, _user_ids
    f: FrameType | None = frame
    while f is not None:
        frame = f
        code = frame.f_code
        key = id(code)
        if key not in library:
            if key in users or _learn_user(code):
                return code.co_filename, frame.f_lineno, code.co_name
        f = frame.f_back
    return None


def _learn_user(code) -> bool:
    _seen.append(code)
    if is_user_file(code.co_filename):
        _user_ids.add(id(code))
        return True
    _library_ids.add(id(code))
    return False

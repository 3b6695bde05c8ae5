"""The innermost user frame of the current call, found by a cheap frame walk (well under 1 us)."""

from __future__ import annotations

import os
import sys
import sysconfig

import torch

_SKIP_PREFIXES = tuple(
    os.path.normcase(os.path.realpath(p)) + os.sep
    for p in (
        os.path.dirname(torch.__file__),
        # the whole neuron_explorer package: the backend, capture, analysis, web
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        sysconfig.get_paths()["stdlib"],
    )
)
# Decisions by id(code), as two sets of ids: hashing a code object hashes its bytecode and
# constants every time (CPython does not cache it), microseconds per frame, and a set
# membership test is cheaper than a dict lookup; `_seen` holds the codes so that no id is
# reused while it is in a set.
_library_ids: set[int] = set()
_user_ids: set[int] = set()
_seen: list = []


def _is_user(code) -> bool:
    return is_user_file(code.co_filename)


def is_user_file(filename: str) -> bool:
    """True for a user's file: not torch, the backend, explorer, the stdlib or site-packages."""
    if filename.startswith("<"):
        return filename in ("<stdin>", "<string>")
    path = os.path.normcase(os.path.realpath(filename))
    return not (path.startswith(_SKIP_PREFIXES) or "site-packages" in path)


def user_frame(depth: int = 2) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame outside torch, backend, explorer and libraries."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    library, users = _library_ids, _user_ids
    while frame is not None:
        code = frame.f_code
        key = id(code)
        if key not in library:
            if key in users or _learn(code):
                return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return None


def _learn(code) -> bool:
    """Decide once whether `code` is user code; True if it is."""
    _seen.append(code)
    if _is_user(code):
        _user_ids.add(id(code))
        return True
    _library_ids.add(id(code))
    return False

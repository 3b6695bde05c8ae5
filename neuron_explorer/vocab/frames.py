"""Whose code a source file is, decided once and by its PATH: ours (never a frame of the run),
torch.profiler's own (the profiler, not the run), torch, the standard library, an installed
library, or the user's.

The same predicate serves the live backend (a code object's file), the Kineto importer (a
trace's frames, perhaps from another machine) and capture. Absolute paths are judged against
this process's directories, then by the markers any install leaves (site-packages, lib/python3).
torch.profiler trims a file under a sys.path entry to a relative path ("torch/nn/...",
"transformers/...", "train.py"): one that exists under the working directory is judged by where
it lies; else by its top-level name (ours, torch's, the stdlib's, a package installed here or a
well-known library), and anything else is the user's. So a user package named `backend` or `web`
is the user's. See docs/format.md ("Attribution").
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import sysconfig
from dataclasses import dataclass

OWN, PROFILER, TORCH = "own", "profiler", "torch"
STDLIB, LIBRARY, USER = "stdlib", "library", "user"
SCOPES = (OWN, PROFILER, TORCH, STDLIB, LIBRARY, USER)
PACKAGE = "neuron_explorer"
TORCH_ROOTS = frozenset({"torch", "functorch", "triton"})
# Libraries a trace from another machine may name by a trimmed path though they are not
# installed here: they are never the user's line.
KNOWN_LIBRARIES = frozenset(
    {
        "torchvision", "torchaudio", "torchtext", "numpy", "transformers", "accelerate",
        "datasets", "tokenizers", "deepspeed", "apex", "fairscale", "lightning",
        "pytorch_lightning", "timm", "tqdm", "typing_extensions", "_pytest", "pytest", "pluggy",
    }
)  # fmt: skip
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/")
_STDLIB_MARKER = "/lib/python3"
# torch.profiler's own frames (record_function, the profile context): the profiler, not the run
_PROFILER_PARTS = ("profiler/", "autograd/profiler")


def _dir(p: str) -> str:
    return os.path.normcase(os.path.realpath(p)).replace("\\", "/").rstrip("/") + "/"


@dataclass(frozen=True)
class Places:
    """The directories of this process that decide an absolute path (normalised, '/'-ended)."""

    own: str
    torch: tuple[str, ...]
    stdlib: tuple[str, ...]
    libraries: tuple[str, ...]  # site-packages / dist-packages directories on sys.path


@functools.cache
def here() -> Places:
    """This process's places (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    torch_dirs = tuple(_dir(p) for p in (spec.submodule_search_locations or ())) if spec else ()
    stdlib = tuple({_dir(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")})
    libs = tuple(_dir(p) for p in sys.path if p and os.path.basename(p) in _LIB_DIR_NAMES)
    return Places(_dir(os.path.dirname(os.path.dirname(__file__))), torch_dirs, stdlib, libs)


_LIB_DIR_NAMES = ("site-packages", "dist-packages")


@functools.lru_cache(maxsize=65536)
def scope_of(path: str) -> str:
    """One of SCOPES: whose code the file at `path` is."""
    if path.startswith("<"):
        if path in ("<stdin>", "<string>"):
            return USER
        return STDLIB if path.startswith("<frozen") else TORCH  # fx's <eval_with_key>
    norm = path.replace("\\", "/")
    if not os.path.isabs(path):
        if os.path.exists(path):  # relative to the working directory (`python train.py`)
            return _scope_of_absolute(_dir(path)[:-1])
        return _scope_of_trimmed(norm)
    scope = _scope_of_absolute(os.path.normcase(norm))
    # a symlinked path may hide one of our places: resolve it (once, cached) only when it
    # would otherwise be the user's, so the common case touches no file system
    if scope == USER and os.path.exists(path):
        real = _dir(path)[:-1]
        if real != norm:
            scope = _scope_of_absolute(real)
    return scope


def _scope_of_absolute(norm: str) -> str:
    places = here()
    if norm.startswith(places.own):
        return OWN
    for d in places.torch:
        if norm.startswith(d):
            return PROFILER if norm[len(d) :].startswith(_PROFILER_PARTS) else TORCH
    for marker in _LIBRARY_MARKERS:
        at = norm.find(marker)
        if at >= 0:  # an install on any machine: judged by its top-level package
            scope = _scope_of_trimmed(norm[at + len(marker) :])
            return scope if scope in (OWN, PROFILER, TORCH) else LIBRARY
    if norm.startswith(places.stdlib) or _STDLIB_MARKER in norm:
        return STDLIB
    if "/torch/" in norm:  # a torch checkout or source build on another machine
        return TORCH
    return USER


def _scope_of_trimmed(rel: str) -> str:
    """A path relative to a sys.path entry, judged by its top-level name."""
    root, _, rest = rel.lstrip("/").partition("/")
    root = root.removesuffix(".py")
    if root == PACKAGE:
        return OWN
    if root in TORCH_ROOTS:
        return PROFILER if root == "torch" and rest.startswith(_PROFILER_PARTS) else TORCH
    if root in sys.stdlib_module_names:
        return STDLIB
    if root in KNOWN_LIBRARIES or _installed(root):
        return LIBRARY
    return USER


@functools.cache
def _installed(root: str) -> bool:
    """Whether `root` is a package or module in one of this process's library directories."""
    return any(
        os.path.exists(d + root) or os.path.exists(d + root + ".py") for d in here().libraries
    )


def is_user_file(path: str) -> bool:
    """True for a file the user wrote: not ours, torch's, the stdlib's or an installed library's."""
    return scope_of(path) == USER


def is_own_file(path: str | None) -> bool:
    """True for a file of this project's own package: never a frame of the run."""
    return path is not None and scope_of(path) == OWN

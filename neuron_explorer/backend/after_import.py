"""Run a hook once a module is imported, without importing it first (FSDP2's modules and
dynamo's trace rules cost a second or more to import, which a program that never uses them
should not pay)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then` once the module `name` is imported (then removes itself)."""

    def __init__(self, name: str, then: Any) -> None:
        self.name, self.then = name, then

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            self.then()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def run_after(name: str, then: Any) -> None:
    """`then()` now if `name` is imported, else right after its import."""
    if name in sys.modules:
        then()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))

"""The chunked import's phases, each with its CPU, page faults and file I/O: runs the CLI
(`import_phases.py import TRACE -o P --memory-budget 256M`) with each phase's function wrapped,
and prints the importer's and its reaped workers' rusage across it to stderr.

The neuron_explorer measured is the one of this file's repository (put first on the path).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's package
from neuron_explorer.importers import kineto_chunked as kc

_FOLDER: list[str] = []  # the chunked import's temporary folder, once known


def _usage() -> tuple[float, ...]:
    a, b = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return (time.monotonic(), a.ru_utime + b.ru_utime, a.ru_stime + b.ru_stime,
            a.ru_minflt + b.ru_minflt, a.ru_oublock + b.ru_oublock, a.ru_inblock + b.ru_inblock)  # fmt: skip


def _folder_bytes() -> int:
    total = 0
    for root, _, files in os.walk(_FOLDER[0]) if _FOLDER else ():
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:  # removed meanwhile
                pass
    return total


def _show(name: str, before: tuple[float, ...], after: tuple[float, ...]) -> None:
    wall, user, system, faults, out, inp = (y - x for x, y in zip(before, after, strict=True))
    own, kids = (resource.getrusage(w).ru_maxrss >> 10
                 for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))  # fmt: skip
    print(f"PHASE {name:16s} wall {wall:7.2f} user {user:7.2f} sys {system:6.2f} "
          f"minflt {int(faults):9d} written {out * 512 / 1e6:6.0f} MB read {inp * 512 / 1e6:6.0f} MB "
          f"folder {_folder_bytes() / 1e6:6.0f} MB peak MB: self {own} workers {kids}",
          file=sys.stderr)  # fmt: skip


def _wrap(name: str, generator: bool = False) -> None:
    real: Callable[..., Any] = getattr(kc, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if name == "plan_spans":
            _FOLDER.append(str(args[4]))
        start = _usage()
        out = list(real(*args, **kwargs)) if generator else real(*args, **kwargs)
        _show(name, start, _usage())
        return iter(out) if generator else out

    setattr(kc, name, wrapped)


def main() -> int:
    for name in ("plan_spans", "route_spans", "global_ids", "write_assembled"):
        _wrap(name)
    _wrap("map_chunks", generator=True)
    from neuron_explorer.entry import main as cli

    start = _usage()
    sys.argv = ["neuron-explorer", *sys.argv[1:]]
    try:
        return cli()
    finally:
        _show("ALL", start, _usage())


if __name__ == "__main__":
    sys.exit(main())

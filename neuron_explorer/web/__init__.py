"""The web UI: what a served PATH is (a profile, a folder of profiles, raw traces imported into
the user cache). The app is assembled in web.app, its pages declared in web.routes, and the
`serve` command that runs it under uvicorn is web/commands/serve.py."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from neuron_explorer.errors import ExplorerError

# torch.profiler traces, and memory snapshot pickles (importers/memory_snapshot.py)
TRACE_SUFFIXES = (".json", ".json.gz", ".pickle", ".pkl")


def cache_dir() -> Path:
    """Where raw traces are imported on the fly: $XDG_CACHE_HOME or ~/.cache, neuron-explorer/."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "neuron-explorer"


def _is_trace(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES)


def _profile_name(trace: Path) -> str:
    stem = trace.name
    for suffix in (".gz", ".json", ".pickle", ".pkl", ".trace", ".pt"):
        stem = stem.removesuffix(suffix)
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", stem).strip("-.") or "trace"


def import_cached(traces: list[Path], source_roots: Sequence[Path] = ()) -> Path:
    """Import raw torch.profiler traces into a cache folder keyed by their paths, sizes and
    mtimes and the source roots (reused while they are unchanged); returns the folder of
    profiles. Sources are kept from each trace's own folder and `source_roots` only."""
    from neuron_explorer.importers import DEFAULT_MEMORY_BUDGET, import_traces
    from neuron_explorer.model.profile import is_profile

    key = hashlib.sha1(b"sources: the trace's folder and the roots named\n")  # not older imports'
    for t in traces:
        st = t.stat()
        key.update(f"{t.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    for r in source_roots:
        key.update(f"root|{Path(r).resolve()}\n".encode())
    out_dir = cache_dir() / key.hexdigest()[:16]
    for t in traces:
        out = out_dir / _profile_name(t)
        if not is_profile(out):
            print(f"importing {t} into {out}", file=sys.stderr)
            import_traces([t], out, source_roots=source_roots, memory_budget=DEFAULT_MEMORY_BUDGET)
    return out_dir


def resolve_root(path: str | Path, source_roots: Sequence[Path] = ()) -> Path:
    """What to serve for PATH: a profile, a folder of profiles, or raw traces imported first
    (keeping Python sources from each trace's folder and `source_roots` only)."""
    from neuron_explorer.model.profile import is_profile

    p = Path(path).expanduser()
    if not p.exists():
        raise ExplorerError(f"{p}: no such file or directory")
    if _is_trace(p):
        return import_cached([p], source_roots) / _profile_name(p)
    if p.is_dir() and not is_profile(p):
        has_profiles = any(is_profile(c) for c in p.iterdir() if c.is_dir())
        traces = sorted(c for c in p.iterdir() if _is_trace(c))
        if not has_profiles and traces:
            return import_cached(traces, source_roots)
        if not has_profiles:
            raise ExplorerError(f"{p}: no profiles or torch.profiler traces in this directory")
    elif not p.is_dir():
        raise ExplorerError(
            f"{p}: not a profile, a directory of profiles, a .json(.gz) trace or a memory snapshot"
        )
    return p

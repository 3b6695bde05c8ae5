"""What the server derives from a profile (summary, findings, operator and line tables), kept on
disk so a restart or a second server of the same profile starts warm.

Entries live in the user cache directory (`web.cache_dir()/analysis`), never in the profile,
which may be read-only. One file per profile path and kind of value, holding the profile's
identity: its path, manifest bytes, the size and mtime of each Parquet file, and the analysis
version (a hash of the code that computes the values). An entry whose identity differs, or that
cannot be read, is ignored and replaced. Files are written to a temporary name, then renamed.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any

from neuron_explorer.analysis.stored import decode, put, writer
from neuron_explorer.model.profile import Profile

FORMAT = 1  # bump when the layout of an entry changes


@cache
def analysis_version() -> str:
    """A hash of the code whose output is cached: neuron_explorer.analysis (rules included), the
    web views and the service that shapes what it stores (web/service.py), so an upgrade or an
    edited rule never serves an old result."""
    import neuron_explorer.analysis

    web = Path(__file__).resolve().parent
    analysis = Path(neuron_explorer.analysis.__file__).resolve().parent
    h = hashlib.sha1(f"format {FORMAT}\n".encode())
    files = [*sorted(analysis.rglob("*.py")), *sorted((web / "views").rglob("*.py")),
             web / "service.py"]  # fmt: skip
    for f in files:
        h.update(f"{f.relative_to(web.parent)}\n".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def profile_identity(profile: Profile) -> str:
    """The profile's path, manifest and Parquet files (sizes, mtimes) as one hash: any rewrite
    or re-import changes it."""
    root = profile.path.resolve()
    h = hashlib.sha1(f"{root}\n{analysis_version()}\n".encode())
    h.update((root / "manifest.json").read_bytes())
    for f in sorted(root.rglob("*.parquet")):
        st = f.stat()
        h.update(f"{f.relative_to(root)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


class AnalysisCache:
    """JSON values and Arrow tables per (profile, kind), on disk under `root`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, profile: Profile, kind: str) -> Path:
        """The entry of one kind of value for a profile (named by the profile's path)."""
        slot = hashlib.sha1(str(profile.path.resolve()).encode()).hexdigest()[:20]
        return self.root / slot / f"{kind}.{'arrow' if kind.endswith('table') else 'json'}"

    def load(self, profile: Profile, kind: str, identity: str) -> Any | None:
        """The stored value, or None when missing, stale or unreadable."""
        path = self.path(profile, kind)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        return decode(data, identity, path.suffix == ".arrow")

    def store(self, profile: Profile, kind: str, identity: str, value: Any) -> None:
        """Write an entry atomically; a cache that cannot be written is skipped silently (the
        value was computed and is served anyway); a table is written straight to the file."""
        put(self.path(profile, kind), writer(identity, value))

"""The profiles a server shows: names from URLs resolved safely inside the served directory,
opened once and cached with whatever the views derive from them."""

from __future__ import annotations

import os
import stat
import threading
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_explorer.analysis.sql import NO_SPILLS
from neuron_explorer.errors import BadInputError, ExplorerError, private
from neuron_explorer.model import Profile
from neuron_explorer.model.excerpt import FOLDER as EXCERPT_FOLDER
from neuron_explorer.model.profile import is_profile

from .memory import trim as _trim

if TYPE_CHECKING:
    import duckdb


def _plain_name(name: str) -> bool:
    """A name a URL may carry: one path component, not hidden (an import writes its temporary
    folder under a `.` name), no control characters. Spaces, non-ASCII letters, a leading `-`
    and long names are all fine: every URL the pages build is percent-encoded."""
    return bool(name) and not name.startswith(".") and "/" not in name and "\\" not in name \
        and not any(ord(c) < 32 or ord(c) == 127 for c in name)  # fmt: skip


# the name of a served profile's excerpt (model/excerpt.py) is its own with this suffix: a `/`
# that no served name holds, so it never names another profile
EXCERPT = "/excerpt"


class NotFound(ExplorerError):
    """A profile, file or event that the URL names does not exist (or may not be named)."""


@dataclass(frozen=True)
class Entry:
    """One profile directory under the root; `error` is set when it cannot be opened."""

    name: str
    path: Path
    error: str | None = None


class ProfileStore:
    """Profiles under `root` (a directory of profiles, or one profile). Thread-safe."""

    def __init__(self, root: str | Path) -> None:
        root = Path(root).resolve()
        self._only: str | None = root.name if is_profile(root) else None
        self.root = root.parent if self._only else root
        self._lock = threading.Lock()
        self._profiles: dict[str, tuple[float, Profile]] = {}
        self._derived: dict[tuple[str, str], Any] = {}
        # (thread, profile name) -> the thread's DuckDB connection of the profile: kept here,
        # not in thread-locals, so that letting a profile go drops its connections too
        self._cons: dict[tuple[int, str], tuple[weakref.ref[Profile], Any]] = {}
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}
        self._profile_locks: dict[str, threading.Lock] = {}
        self._failed: dict[str, tuple[tuple, BadInputError]] = {}
        # called before a value is computed (Service: the bounds of values and the memory
        # ceiling's admission)
        self.before_compute: Callable[[str, Profile], None] = lambda name, profile: None
        # the block each computation runs in (the server's: what it admits stays reserved)
        self.running: Callable[[], AbstractContextManager[None]] = nullcontext
        self.duckdb_memory = 0  # bytes each DuckDB connection may use (0: DuckDB's default)

    def shown(self, text: str) -> str:
        """`text` (an error message) as a visitor may read it: paths in the served folder by
        their names in it, the home folder as `~` (errors.private)."""
        return private(text.replace(f"{self.root}/", "").replace(str(self.root), "."))

    def names(self) -> list[str]:
        """Names of the profile directories that can be served, sorted."""
        return self.scan()[0]

    def scan(self) -> tuple[list[str], list[dict[str, str]]]:
        """(names that can be served, [{name, reason}] for profiles in the folder that cannot
        be, so the list can say why a profile the user sees on disk is not there)."""
        if self._only:
            return [self._only], []
        try:
            children = sorted(p.name for p in self.root.iterdir())
        except OSError:
            return [], []
        served, skipped = [], []
        for n in children:
            try:
                if not is_profile(self.root / n):
                    continue
            except OSError:
                continue
            reason = self._why_not(n)
            if reason:
                skipped.append({"name": n, "reason": reason})
            else:
                served.append(n)
        return served, skipped

    def _why_not(self, name: str) -> str | None:
        if name.startswith("."):
            return "hidden folder (an import still in progress writes one); rename it without the leading '.' to serve it"
        if not _plain_name(name):
            return "the name holds control characters; rename the folder to serve it"
        if not self._inside(name):
            return "a symbolic link to a folder outside the served folder; only links that stay inside it are served"
        return None

    def _inside(self, name: str) -> bool:
        """Whether root/name is, or links to, a directory directly inside the root."""
        try:
            resolved = (self.root / name).resolve(strict=True)
        except (OSError, RuntimeError):
            return False
        return resolved.parent == self.root

    def path(self, name: str) -> Path:
        """The directory of a served profile, or of its excerpt (`NAME/excerpt`); NotFound for
        anything else (.., /, symlinks out)."""
        if name.endswith(EXCERPT) and _plain_name(name.removesuffix(EXCERPT)):
            path = self.path(name.removesuffix(EXCERPT)) / EXCERPT_FOLDER
            if not is_profile(path) or path.is_symlink() or path.parent.is_symlink():
                raise NotFound(f"no excerpt of {name.removesuffix(EXCERPT)!r}")
            return path
        if not _plain_name(name) or (self._only and name != self._only) or not self._inside(name):
            raise NotFound(f"no profile named {name!r}")
        path = self.root / name
        if not is_profile(path):
            raise NotFound(f"no profile named {name!r}")
        return path

    def open(self, name: str) -> Profile:
        """The opened profile (cached until its manifest changes); BadInputError if corrupt."""
        path = self.path(name)
        stamp = _only_regular_files(path)
        mtime = (path / "manifest.json").stat().st_mtime
        with self._lock:
            hit = self._profiles.get(name)
            if hit and hit[0] == mtime:
                return hit[1]
            failed = self._failed.get(name)
            if failed and failed[0] == stamp:  # refused before, and no file has changed since
                raise failed[1]
        try:
            profile = Profile.open(path)
            _check_tables(profile)
        except BadInputError as e:
            with self._lock:
                self._failed[name] = (stamp, e)
            _trim()  # a refused footer may have taken tens of MB to parse: give them back
            raise
        with self._lock:
            if name in self._profiles and self._profiles[name][0] != mtime:
                self._derived = {k: v for k, v in self._derived.items() if k[0] != name}
            self._profiles[name] = (mtime, profile)
        return profile

    def derived(
        self, name: str, key: str, make: Callable[[Profile], Any], admit: bool = True
    ) -> Any:
        """A value computed once per profile (summary, operator table, timeline index...);
        concurrent requests for the same value wait for the one computing it. `admit`: pass
        `before_compute` first (False when `make` calls it only if it must read the tables)."""
        profile = self.open(name)
        with self._lock:
            if (name, key) in self._derived:
                return self._derived[(name, key)]
            key_lock = self._key_locks.setdefault((name, key), threading.Lock())
        with key_lock:
            with self._lock:
                if (name, key) in self._derived:
                    return self._derived[(name, key)]
            with self.running():
                if admit:
                    self.before_compute(name, profile)
                try:
                    value = make(profile)
                except (OverflowError, RecursionError) as e:  # what the data holds, not a bug
                    raise BadInputError(profile.path, f"cannot be analysed ({e})") from None
            with self._lock:
                self._derived[(name, key)] = value
        return value

    def forget(self, keep: str | None = None) -> None:
        """Let go of every profile but `keep` (with its excerpt, or the whole of an excerpt:
        one profile to its user, whose timeline must not drop its analysis pages' tables)
        and what was derived from it (they are opened and computed again when asked for; the
        disk cache keeps what took seconds)."""
        base = keep.removesuffix(EXCERPT) if keep is not None else None
        kept = {base, base + EXCERPT} if base is not None else set()
        with self._lock:
            self._profiles = {n: v for n, v in self._profiles.items() if n in kept}
            self._derived = {k: v for k, v in self._derived.items() if k[0] in kept}
            self._cons = {k: v for k, v in self._cons.items() if k[1] in kept}

    def has(self, name: str, key: str) -> bool:
        """Whether a derived value is already in memory (for a profile still current)."""
        with self._lock:
            return (name, key) in self._derived

    def profile_lock(self, name: str) -> threading.Lock:
        """Serialises work that shares one connection per profile (neuron_explorer.analysis's context)."""
        with self._lock:
            return self._profile_locks.setdefault(name, threading.Lock())

    def connection(self, name: str) -> duckdb.DuckDBPyConnection:
        """This thread's DuckDB connection with the profile's tables registered (connecting
        costs tens of ms, so each server thread keeps one per profile)."""
        profile = self.open(name)
        profile.check_values()
        key = (threading.get_ident(), name)
        with self._lock:
            hit = self._cons.get(key)
        # the profile held weakly, so a forgotten one (and its analysis) can be freed
        if hit is None or hit[0]() is not profile:
            import duckdb

            con = duckdb.connect()
            con.execute(NO_SPILLS)  # nothing written to `.tmp` in the server's working directory
            if self.duckdb_memory:
                con.execute(f"SET memory_limit = '{self.duckdb_memory >> 20}MB'")
            for table in ("events", "stacks", "counters"):
                con.register(table, profile.dataset(table))
            hit = (weakref.ref(profile), con)
            with self._lock:
                self._cons[key] = hit
        return hit[1]


def _check_tables(profile: Profile) -> None:
    """Read every Parquet footer now, so a corrupt table fails here, not in the middle of a view."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for table in ("events", "stacks", "counters"):
        for file in profile.dataset(table).files:
            try:
                pq.read_metadata(file)
            except (pa.ArrowException, OSError) as e:
                raise BadInputError(file, f"corrupt Parquet table ({e})") from None


def _only_regular_files(path: Path) -> tuple[tuple[str, int, int], ...]:
    """Refuse a profile whose manifest or tables are not plain files (opening a named pipe
    blocks until someone writes to it, which would hang every request that lists profiles),
    or that holds a symbolic link leading out of its own folder: profiles arrive as tarballs,
    which keep links, and the served folder is a fence for every file the server opens.
    Returns each file's (path, size, mtime), which say whether the profile has changed.
    Walked as os.walk walks (links to folders not entered, each folder's entries checked
    before its subfolders), with os.scandir's entry types: every request opens its profile
    several times (0.4 ms a walk through os.walk and pathlib, 0.1 ms so)."""
    fence = path.resolve()
    stamp: list[tuple[str, int, int]] = []

    def visit(folder: Path) -> None:
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:  # as os.walk: a folder that cannot be listed is passed over
            return
        dirs: list[os.DirEntry[str]] = []
        files: list[os.DirEntry[str]] = []
        for e in entries:
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(e)
        for e in (*dirs, *files):
            if e.is_symlink() and not (e.name == "sources" and folder == path):
                _inside_fence(Path(e.path), fence)
        for e in files:
            if e.name == "manifest.json" or e.name.endswith(".parquet"):
                file = Path(e.path)
                try:
                    st = file.stat()
                except OSError as err:
                    raise BadInputError(file, f"cannot read ({err.strerror or err})") from None
                if not stat.S_ISREG(st.st_mode):
                    raise BadInputError(file, "not a regular file (a named pipe or a device?)")
                stamp.append((str(file), st.st_size, st.st_mtime_ns))
        # source text is read by id, each read fenced itself (Profile.source_text)
        for e in dirs:
            if e.name != "sources" and not e.is_symlink():
                visit(Path(e.path))

    visit(path)
    return tuple(sorted(stamp))


def _inside_fence(entry: Path, fence: Path) -> None:
    """Refuse a link whose target, every component resolved, is not inside `fence`."""
    if not entry.is_symlink():
        return
    try:
        target = entry.resolve(strict=True)
    except (OSError, RuntimeError):
        raise BadInputError(entry, "a broken or looping symbolic link") from None
    if not target.is_relative_to(fence):
        raise BadInputError(entry, "a symbolic link out of the profile's folder (not followed)")

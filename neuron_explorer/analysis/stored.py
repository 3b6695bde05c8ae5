"""The analysis a profile keeps in its own folder (`analysis/`, docs/format.md): what the first
page of a large profile needs (the summary, the devices that ran work, the operator and line
tables), computed once by `neuron-explorer import` so that a server's first visit reads a few
small files instead of decoding millions of events (the 1 GB trace's profile: ~10 s of CPU).

Every file starts with one line, the identity of what it was computed from: the stored format,
a hash of the code that computes the values (every module this one imports, transitively), the
manifest's bytes and each Parquet file's size and footer. A file whose identity differs (a
rewritten table, another version of the code) or that cannot be read is ignored, and the value
is computed as if it were not there, so a stored value is always the one computing it gives.
Files are written to a temporary name and renamed; a read-only profile is simply not written.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from ..model import footprint
from ..model.bounds import machine_bytes
from ..model.profile import Profile
from ..model.schema import TABLES

FOLDER = "analysis"
FORMAT = 1  # bump when the layout of a stored file changes
FOOTER_BYTES = 64 << 10  # a Parquet file's tail: its footer (row groups, statistics) and more
# the import stores the analysis of profiles this large; below it the server's own cold
# analysis takes well under a second, and a small import stays as fast as before
STORE_MIN_EVENTS = 100_000
MAX_BYTES = 256 << 20  # the 1 GB trace's summary is 6.6 MB
STORE_SHARE = 0.5  # of the memory this process may use (model/bounds.machine_bytes)


def _summary(p: Profile) -> dict[str, Any]:
    from .summary import summarize

    return summarize(p).to_dict()


def _devices(p: Profile) -> list[str]:
    from .overview import devices

    return devices(p)


def _ops(p: Profile) -> pa.Table:
    from .context import context
    from .operators import operator_table

    return operator_table(context(p).cols)


def _lines(p: Profile) -> pa.Table:
    from .context import context
    from .lines import line_table

    return line_table(context(p).cols)


def _findings(p: Profile) -> dict[str, Any]:
    from .runner import findings_report

    return findings_report(p).to_dict()


# kind -> how it is computed; a kind ending in `_table` is an Arrow table, the others JSON
KINDS: dict[str, Callable[[Profile], Any]] = {
    "summary": _summary,
    "devices": _devices,
    "ops_table": _ops,
    "lines_table": _lines,
    "findings_report": _findings,
}
# kind -> the modules (of this package) whose code computes it, with what they import
ENTRIES = {
    "summary": ("summary",),
    "devices": ("overview",),
    "ops_table": ("context", "operators"),
    "lines_table": ("context", "lines"),
    "findings_report": ("runner",),
}
PATHS = ("summary", "findings_report")  # their `profile` field names the folder opened


_VERSION_LOCK = threading.Lock()  # ast.parse from two threads at once fails (CPython 3.11)


def code_version(kind: str) -> str:
    with _VERSION_LOCK:
        return _code_version(kind)


@cache
def _code_version(kind: str) -> str:
    """A hash of the code whose output `kind` is: its ENTRIES modules and every module of the
    package they import, directly or not (late imports included), so an upgrade or an edit of
    any of them makes it stale, and an edit elsewhere (a rule, for the summary; a page) does
    not; so does another numpy, pyarrow or DuckDB, or another layout of these files."""
    from importlib.metadata import version

    here = Path(__file__).resolve()
    root = here.parent.parent
    libraries = " ".join(f"{lib} {version(lib)}" for lib in ("numpy", "pyarrow", "duckdb"))
    h = hashlib.sha1(f"stored format {FORMAT} {kind}\n{libraries}\n".encode())
    files = {here}  # this file itself (how each kind is computed), not what it imports
    for module in ENTRIES[kind]:
        files |= _imported(here.with_name(f"{module}.py"), root)
    for f in sorted(files):
        h.update(f"{f.relative_to(root)}\n".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _imported(start: Path, root: Path) -> set[Path]:
    """The package's source files that `start` imports, transitively (by reading them)."""
    seen, todo = set(), [start]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += _direct_imports(f, root)
    return seen


@cache
def _direct_imports(f: Path, root: Path) -> tuple[Path, ...]:
    """The package's files that the source file `f` imports itself (each file parsed once for
    every kind: the first page pays this once per server)."""
    import ast

    pkg, out = f.parent, []
    for node in ast.walk(ast.parse(f.read_bytes())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = pkg.parents[node.level - 2] if node.level > 1 else pkg
            names = [a.name for a in node.names]
            if node.module is None:  # `from . import facts`: the modules named only
                out += [m for n in names for m in _module_files(base / n)]
            else:
                out += _module_files(base.joinpath(*node.module.split(".")), names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""]  # fmt: skip
            for name in names:
                if name.split(".")[0] == root.name:
                    out += _module_files(root.parent.joinpath(*name.split(".")))
    return tuple(out)


def _module_files(mod: Path, names: tuple[str, ...] | list[str] = ()) -> list[Path]:
    """The files of module `mod` (a .py file or a package), and of those `names` in it that
    are modules themselves (`from . import facts`)."""
    out = [f for f in (mod.with_suffix(".py"), mod / "__init__.py") if f.is_file()]
    for name in names:
        out += [f for f in ((mod / name).with_suffix(".py"), mod / name / "__init__.py")
                if f.is_file()]  # fmt: skip
    return out


def identity(profile: Profile) -> str:
    """What the stored values were computed from, as one hash (each file's first line is this
    with its kind's code_version). The tables' Parquet files are named by their size and
    footer (not their mtime), so a copied profile keeps its stored analysis; other files
    (sources/) are not read."""
    root = profile.path
    h = hashlib.sha1(b"profile\n")
    h.update((root / "manifest.json").read_bytes())
    files = {Path(f) for name in TABLES for f in profile.dataset(name).files}  # the tables only
    for f in sorted(files):
        size = f.stat().st_size
        with f.open("rb") as fh:
            fh.seek(max(0, size - FOOTER_BYTES))
            tail = fh.read()
        rel = os.path.relpath(f, root)
        h.update(f"{rel}|{size}|{hashlib.sha1(tail).hexdigest()}\n".encode())
    return h.hexdigest()


def path(profile: Profile, kind: str) -> Path:
    return profile.path / FOLDER / f"{kind}.{'arrow' if kind.endswith('_table') else 'json'}"


def load(profile: Profile, kind: str, ident: str | None = None, stale: bool = False) -> Any | None:
    """The stored value of `kind`, or None when it is missing, stale or unreadable. `ident`:
    the profile's identity when the caller has it (it reads every Parquet footer). `stale`:
    also one an earlier version of the code computed from these same tables (a server that
    cannot compute it again serves it, saying so)."""
    try:
        data = _read(path(profile, kind))
        if data is None:
            return None
        line = _line(kind, ident or identity(profile))
        if stale:  # the first line's second half names the tables only
            first = data[: data.find(b"\n")].decode("ascii", "replace")
            line = first if first.partition(" ")[2] == line.partition(" ")[2] else line
        value = decode(data, line, kind.endswith("_table"))
    except OSError:
        return None
    if kind in PATHS and isinstance(value, dict):
        value["profile"] = str(profile.path)  # the one field that names where it is opened
    return value


def _line(kind: str, ident: str) -> str:
    """The first line of a stored file: a hash of the profile's identity and the kind's code,
    then one of the identity alone (what `load(stale=True)` matches)."""
    code = hashlib.sha1(f"{kind}\n{code_version(kind)}\n{ident}\n".encode()).hexdigest()
    tables = hashlib.sha1(f"{kind}\n{ident}\n".encode()).hexdigest()
    return f"{code} {tables}"


def _read(file: Path) -> bytes | None:
    """The bytes of a regular file of at most MAX_BYTES; None for anything else (a named pipe
    would block the reader, and a huge file is no analysis this code wrote)."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def memory_needed(profile: Profile) -> int:
    """Bytes the analysis of `profile` needs (model/footprint.py: the server admits its tables
    by the same estimate)."""
    return footprint.analysis_bytes(profile)


def events_within(limit: int, profile: Profile) -> int:
    """How many of `profile`'s events an analysis within `limit` bytes may hold (at least one)."""
    return footprint.events_within(limit, profile)


def analysis_limit(budget: int | None = None) -> tuple[int, str]:
    """(bytes the import's analysis may use, what that limit is): the import's memory budget,
    or STORE_SHARE of what this process may use when that is lower."""
    machine = int(machine_bytes() * STORE_SHARE)
    if budget is not None and budget <= machine:
        return budget, f"the {_size(budget)} memory budget (--memory-budget)"
    return machine, f"{_size(machine)} (half of this machine's memory)"


def too_big(profile: Profile, budget: int | None = None) -> str | None:
    """Why the import does not analyse `profile` whole (None: it fits): its estimated memory
    over the import's memory budget or STORE_SHARE of this machine's, so a huge trace's import
    cannot take the machine down after writing its profile."""
    need, (limit, what) = memory_needed(profile), analysis_limit(budget)
    if need <= limit:
        return None
    return f"the whole profile's analysis would need about {_size(need)}, over {what}"


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:,.0f} MB" if n >= 2**20 \
        else f"{n / 2**10:,.0f} KB"  # fmt: skip


def write(profile: Profile, kinds: tuple[str, ...] = tuple(KINDS)) -> list[str]:
    """Compute and store `kinds` in the profile's folder; the kinds written (none when the
    folder cannot be written: the values are then computed when asked for, as without it)."""
    ident = identity(profile)
    for left in (profile.path / FOLDER).glob(".*.tmp"):  # from a write that was killed
        left.unlink(missing_ok=True)
    written = []
    for kind in kinds:
        value = KINDS[kind](profile)
        if _put(path(profile, kind), _line(kind, ident), value):
            written.append(kind)
    return written


def _put(target: Path, ident: str, value: Any) -> bool:
    # as readable as the profile's other files (mkstemp makes 0600)
    return put(target, writer(ident, value), mode=0o644, parents=False)


def writer(ident: str, value: Any) -> Callable[[BinaryIO], None]:
    """What writes an entry into an open file (the layout of this folder's files and of the
    web's own cache, web/cache.py): its identity line, then an Arrow table as an IPC file,
    straight to the file (built in memory first, the 10 GB trace's 256 MB timeline pyramid
    was two more copies of it), or a value as JSON."""

    def write(f: BinaryIO) -> None:
        f.write(ident.encode("ascii") + b"\n")
        if isinstance(value, pa.Table):
            with pa.ipc.new_file(f, value.schema) as ipc:
                ipc.write_table(value)
        else:
            f.write(json.dumps(value, separators=(",", ":")).encode())

    return write


def decode(data: bytes, ident: str, arrow: bool) -> Any | None:
    """The value of an entry written by `writer`; None when its identity is not `ident` or its
    body cannot be read. A table's columns are read in place from `data` (no copy)."""
    end = data.find(b"\n")
    if end < 0 or data[:end].decode("ascii", "replace") != ident:
        return None
    try:
        if arrow:
            with pa.ipc.open_file(pa.BufferReader(pa.py_buffer(data)[end + 1 :])) as reader:
                return reader.read_all()
        return json.loads(data[end + 1 :])
    except (ValueError, pa.ArrowException):
        return None


def put(
    target: Path, data: bytes | Callable[[BinaryIO], None], mode: int | None = None,
    parents: bool = True,
) -> bool:  # fmt: skip
    """Write `data` (bytes, or what writes them into an open file) to `target` atomically (a
    temporary name, then a rename); False when it cannot be written (the value is computed
    when asked for, as without it)."""
    try:
        target.parent.mkdir(parents=parents, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            if mode is not None:
                os.chmod(tmp, mode)
            with os.fdopen(fd, "wb") as f:
                if isinstance(data, bytes):
                    f.write(data)
                else:
                    data(f)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        return False
    return True

"""The source page: files and lines ranked by time (the line table: host time, device time and
op count per launching line, written once, here, over numpy arrays), any file of the stacks
with the device self and total time of its lines, one file annotated line by line, and one
line's ops, events and kernels. Code comes from the profile's sources/ folder only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..model.profile import Profile
from . import hotspots
from .columns import Columns, find_rows, group_sum, groups
from .operators import LAUNCH_KINDS
from .page import PageModel, fetch_rows, is_modeled

WORK_SQL = ", ".join(f"'{k}'" for k in hotspots.DEVICE_WORK)
TOP_LINES = 50


def line_table(cols: Columns) -> pa.Table:
    """Host and device time per source line (file, line, func, host_ns, device_ns, ops,
    launches). Host time counts each event once: an event whose parent sits on the same line
    is already inside its parent's time. Device work without a line takes its launch's line."""
    file, files = cols.codes("src_file")
    rows, on_line = _host_rows(cols, file, files)
    _add_device_rows(cols, file, files, rows, on_line)
    # lines with both host and device time first, by their sum; then the rest by their time
    # and line (the order of the reference SQL in tests/reference_sql.py)
    rows.sort(key=lambda r: (not (r[7] and r[8]), -(r[3] + r[4]), r[0], r[1] is None, r[1] or 0))
    names = ("file", "line", "func", "host_ns", "device_ns", "ops", "launches")
    types = (pa.string(), pa.int32(), pa.string(), *[pa.int64()] * 4)
    return pa.table(
        {
            k: pa.array([r[i] for r in rows], t)
            for i, (k, t) in enumerate(zip(names, types, strict=True))
        }
    )


def _host_rows(cols: Columns, file: np.ndarray, files: list[str]) -> tuple[list[list], dict]:
    """Rows of [file, line, func, host_ns, 0, ops, 0, has host, False], and them by line."""
    dur = cols.ints("dur_ns")
    line, has_line = cols.ints("src_line"), cols.valid("src_line")
    func, funcs = cols.codes("src_func")
    e = np.flatnonzero(
        cols.where("layer", ("host",)) & (file >= 0) & ~cols.where("kind", ("step", "python"))
    )
    found = find_rows(cols, e, cols.ints("parent_id")[e])
    found = np.where(cols.valid("parent_id")[e], found, -1)
    p = np.where(found >= 0, found, e)  # the parent's row, or the event's own (then unused)
    inside = (found >= 0) & (file[p] == file[e]) & has_line[p] & has_line[e] & (line[p] == line[e])
    first, group, n = groups(file[e], _line_key(line[e], has_line[e]))
    host_ns = group_sum(group, np.where(inside, 0, dur[e]), n)
    counted = np.bincount(group, weights=~inside, minlength=n)  # host_ns is NULL without any
    ops = np.bincount(group, weights=cols.where("kind", ("op",))[e], minlength=n)
    named = np.flatnonzero(func[e] >= 0)  # any_value: the group's first function name
    fn = np.full(n, -1)
    with_fn, at_fn = np.unique(group[named], return_index=True)
    fn[with_fn] = func[e][named[at_fn]]
    rows: list[list] = []
    on_line: dict[tuple[str, int | None], list] = {}
    for g in range(n):
        r = e[first[g]]
        row = [files[file[r]], int(line[r]) if has_line[r] else None,
               funcs[fn[g]] if fn[g] >= 0 else "", int(host_ns[g]), 0, int(ops[g]), 0,
               counted[g] > 0, False]  # fmt: skip
        rows.append(row)
        if row[1] is not None:
            on_line[(row[0], row[1])] = row
    return rows, on_line


def _add_device_rows(
    cols: Columns, file: np.ndarray, files: list[str], rows: list[list], on_line: dict
) -> None:
    """Each launch on its own line, or else on the line of the host call that launched it."""
    dur = cols.ints("dur_ns")
    line, has_line = cols.ints("src_line"), cols.valid("src_line")
    flow, has_flow = cols.ints("flow_id"), cols.valid("flow_id")
    launch = np.flatnonzero(cols.where("layer", ("host",)) & has_flow & (file >= 0))
    flows, lfirst = np.unique(flow[launch], return_index=True)
    lined = launch[has_line[launch]]
    lflows, lline_first = np.unique(flow[lined], return_index=True)
    d = np.flatnonzero(cols.where("layer", ("device",)) & cols.where("kind", LAUNCH_KINDS))
    at = np.minimum(np.searchsorted(flows, flow[d]), max(len(flows) - 1, 0))
    hit = has_flow[d] & (flows[at] == flow[d]) if len(flows) else np.zeros(len(d), dtype=bool)
    launch_file = file[launch[lfirst[at]]] if len(flows) else np.full(len(d), -1)
    dfile = np.where(file[d] >= 0, file[d], np.where(hit, launch_file, -1))
    lat = np.minimum(np.searchsorted(lflows, flow[d]), max(len(lflows) - 1, 0))
    lhit = has_flow[d] & (lflows[lat] == flow[d]) if len(lflows) else np.zeros(len(d), dtype=bool)
    dline_ok = has_line[d] | lhit
    dline = np.where(has_line[d], line[d], line[lined[lline_first[lat]]] if len(lflows) else 0)
    keep = dfile >= 0  # launches without a file are not on any line
    d, dfile, dline, dline_ok = d[keep], dfile[keep], dline[keep], dline_ok[keep]
    first, group, n = groups(dfile, _line_key(dline, dline_ok))
    device_ns = group_sum(group, dur[d], n)
    launches = np.bincount(group, minlength=n)
    for g in range(n):
        ln = int(dline[first[g]]) if dline_ok[first[g]] else None
        # a NULL line joins no host row (SQL equality), so it keeps a row of its own
        row = on_line.get((files[dfile[first[g]]], ln)) if ln is not None else None
        if row is None:
            row = [files[dfile[first[g]]], ln, "", 0, 0, 0, 0, False, True]
            rows.append(row)
        row[4], row[6], row[8] = int(device_ns[g]), int(launches[g]), True


def _line_key(line: np.ndarray, has_line: np.ndarray) -> np.ndarray:
    """A non-negative group key per line number, 0 for none (NULL lines group together)."""
    return np.where(has_line, line.astype(np.int64) - (int(line.min()) if len(line) else 0) + 1, 0)


def read_source(profile: Profile, path: str) -> str | None:
    """The kept text of `path` (Profile.source_text: only from inside the profile's sources/
    folder, never through a link out of it, at most MAX_SOURCE_READ_BYTES)."""
    return profile.source_text(path)


def model_line_table(profile: Profile, con=None, level: str = "model") -> pa.Table:
    """Device self and total time per line of every file in the stacks (analysis/hotspots.py):
    at `level` (user, model or all) for the files that level reads, at every frame for the
    rest (torch's files at the user or model level)."""
    con = con or profile.duckdb()
    every = hotspots.line_hotspots(profile, "all", con)
    if level == "all":
        return every
    chosen = hotspots.line_hotspots(profile, level, con)
    rest = every.filter(pc.invert(pc.is_in(every.column("file"), chosen.column("file"))))
    return pa.concat_tables([chosen, rest])


def files_of(lines: pa.Table, profile: Profile) -> list[dict[str, Any]]:
    """The files of the line table by host plus device time, with whether their text is kept."""
    files: dict[str, dict[str, Any]] = {}
    for r in lines.to_pylist():
        f = files.setdefault(r["file"], {"file": r["file"], "host_ns": 0, "device_ns": 0,
                                         "ops": 0, "lines": 0})  # fmt: skip
        f["host_ns"] += r["host_ns"]
        f["device_ns"] += r["device_ns"]
        f["ops"] += r["ops"]
        f["lines"] += 1
    out = sorted(files.values(), key=lambda f: -(f["host_ns"] + f["device_ns"]))
    for f in out:
        f["has_source"] = profile.source_path(f["file"]) is not None  # not read: a stat
    return out


def hot_lines(lines: pa.Table, n: int = 10) -> list[dict[str, Any]]:
    """The first `n` rows of the line table (it is ordered by time)."""
    return lines.slice(0, n).to_pylist()


def model_files(model: pa.Table, profile: Profile) -> list[dict[str, Any]]:
    """Files by the device time of their lines: self summed, total of their hottest line."""
    files: dict[str, dict[str, Any]] = {}
    for r in model.to_pylist():
        f = files.setdefault(r["file"], {"file": r["file"], "self_ns": 0, "total_ns": 0,
                                         "lines": 0})  # fmt: skip
        f["self_ns"] += r["self_ns"]
        f["total_ns"] = max(f["total_ns"], r["total_ns"])
        f["lines"] += 1
    out = sorted(files.values(), key=lambda f: (-f["self_ns"], -f["total_ns"]))
    for f in out:
        f["has_source"] = profile.source_path(f["file"]) is not None  # not read: a stat
    return out


def top_model_lines(model: pa.Table, n: int = TOP_LINES) -> list[dict[str, Any]]:
    """The `n` lines with the most device self time."""
    rows = [r for r in model.to_pylist() if r["self_ns"]]
    rows.sort(key=lambda r: -r["self_ns"])
    return rows[:n]


@dataclass(frozen=True)
class SourcePage(PageModel):
    """The source page: launching lines and their files (the line table), and every stacked
    file's lines by device self time at `level`."""

    level: str
    files: tuple[dict[str, Any], ...]
    top_lines: tuple[dict[str, Any], ...]
    model_files: tuple[dict[str, Any], ...]
    top_model_lines: tuple[dict[str, Any], ...]
    device_time_modeled: bool


def source_page(
    profile: Profile, lines: pa.Table, model: pa.Table, level: str = "model"
) -> SourcePage:
    """The source page of a line table and a model line table (the web caches both)."""
    return SourcePage(level, tuple(files_of(lines, profile)), tuple(hot_lines(lines, TOP_LINES)),
                      tuple(model_files(model, profile)), tuple(top_model_lines(model)),
                      is_modeled(profile))  # fmt: skip


@dataclass(frozen=True)
class SourceFile(PageModel):
    """One file's code, line by line, with host and device time, ops and launches (the line
    table) and device self and total time (the model line table). The lines are those of the
    kept text, plus the lines the tables name beyond it (at most MAX_NAMED_ONLY_LINES, the
    rest counted in `lines_omitted`); with `around`, only those within `context` of it."""

    file: str
    name: str
    has_source: bool
    device_time_modeled: bool
    max_ns: int
    max_total_ns: int
    lines: tuple[dict[str, Any], ...]
    lines_omitted: int = 0


# A profile names its lines itself: a listing never fills the gap up to a line number it claims
# (2**31 - 1 rows would take the server's memory), only the file's own lines and the named ones.
MAX_NAMED_ONLY_LINES = 2000
MAX_CONTEXT_LINES = 500


def source_file(
    profile: Profile,
    lines: pa.Table,
    path: str,
    model: pa.Table | None = None,
    around: int | None = None,
    context: int = 50,
) -> SourceFile:
    """The annotated listing of `path` (a file named by the line or model line table), or of
    the lines within `context` (at most MAX_CONTEXT_LINES) of line `around`."""
    stats = {r["line"]: r for r in lines.filter(pc.equal(lines.column("file"), path)).to_pylist()}
    work: dict[int, dict[str, Any]] = {}
    if model is not None:
        chosen = model.filter(pc.equal(model.column("file"), path))
        work = {r["line"]: r for r in chosen.to_pylist()}
    text = read_source(profile, path)
    code = text.splitlines() if text is not None else []
    first, last = 1, len(code)
    if around is not None:
        k = min(max(context, 0), MAX_CONTEXT_LINES)
        first, last = max(1, around - k), min(len(code), around + k)
    named = sorted({k for k in (*stats, *work) if k is not None and k > len(code)})
    if around is not None:
        named = [k for k in named if abs(k - around) <= min(max(context, 0), MAX_CONTEXT_LINES)]
    omitted = max(0, len(named) - MAX_NAMED_ONLY_LINES)
    rows = []
    for i in [*range(first, last + 1), *named[:MAX_NAMED_ONLY_LINES]]:
        s, w = stats.get(i, {}), work.get(i, {})
        rows.append({
            "line": i, "code": code[i - 1] if i <= len(code) else None,
            "host_ns": s.get("host_ns", 0), "device_ns": s.get("device_ns", 0),
            "ops": s.get("ops", 0), "launches": s.get("launches", 0),
            "self_ns": w.get("self_ns", 0), "total_ns": w.get("total_ns", 0),
        })  # fmt: skip
    return SourceFile(
        file=path, name=Path(path).name, has_source=text is not None,
        device_time_modeled=is_modeled(profile),
        max_ns=max((r["host_ns"] + r["device_ns"] for r in rows), default=0),
        max_total_ns=max((r["total_ns"] for r in rows), default=0), lines=tuple(rows),
        lines_omitted=omitted,
    )  # fmt: skip


@dataclass(frozen=True)
class LineDetail(PageModel):
    """The ops and device work at one line, with a few events to jump to on the timeline."""

    file: str
    line: int
    ops: tuple[dict[str, Any], ...]
    events: tuple[dict[str, Any], ...]
    kernels: tuple[dict[str, Any], ...]


def line_detail(con, path: str, line: int) -> LineDetail:
    """What ran at `path`:`line` (a DuckDB connection over the profile's tables)."""

    def rows(sql: str) -> tuple[dict[str, Any], ...]:
        return fetch_rows(con, sql, [path, line])

    ops = rows(
        "SELECT CAST(name AS VARCHAR) AS name, CAST(kind AS VARCHAR) AS kind, "
        "CAST(layer AS VARCHAR) AS layer, count(*) AS count, CAST(sum(dur_ns) AS BIGINT) AS total_ns, "
        "min(id) AS first_id FROM events WHERE src_file = ? AND src_line = ? "
        "AND kind NOT IN ('step', 'python') GROUP BY ALL ORDER BY total_ns DESC, name, kind, layer LIMIT 100"
    )
    events = rows(
        "SELECT id, CAST(name AS VARCHAR) AS name, CAST(kind AS VARCHAR) AS kind, start_ns, "
        "dur_ns, step FROM events WHERE src_file = ? AND src_line = ? AND kind = 'op' "
        "ORDER BY dur_ns DESC, id LIMIT 20"
    )
    # the device work with this line anywhere in its stack: a library line's kernels too
    kernels = rows(
        f"SELECT e.id, CAST(e.name AS VARCHAR) AS name, CAST(e.kind AS VARCHAR) AS kind, "
        f"CAST(e.module AS VARCHAR) AS module, e.start_ns, e.dur_ns, e.step FROM events e "
        f"WHERE e.kind IN ({WORK_SQL}) AND e.stack_id IN "
        f"(SELECT stack_id FROM stacks WHERE file = ? AND line = ?) ORDER BY e.dur_ns DESC, e.id LIMIT 50"
    )
    return LineDetail(path, line, ops, events, kernels)

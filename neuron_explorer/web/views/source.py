"""Source hotspots: files and lines ranked by time, and a file's code annotated line by line with
host time, device time and op count, and (any file of the stacks, library files included) the
device self and total time of its lines with the kernels of each. Code comes from the profile's
sources/ folder only."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from neuron_explorer.analysis import hotspots
from neuron_explorer.analysis.columns import Columns, find_rows, group_sum, groups
from neuron_explorer.model import Profile
from neuron_explorer.model.io import SOURCES, source_relpath

from . import fetch_dicts
from .operators import _LAUNCH_SQL, LAUNCH_KINDS

_WORK_SQL = ", ".join(f"'{k}'" for k in hotspots.DEVICE_WORK)

# The line table's definition; line_table computes the same over numpy arrays (a test checks
# that they agree on real profiles).
# Host time of a line counts each event once: an event whose parent sits on the same line is
# already inside its parent's time. Device work without a line takes its launch's line.
LINES_SQL = f"""
WITH hp AS (
    SELECT id, src_file, src_line FROM events
    WHERE layer = 'host' AND src_file IS NOT NULL AND kind NOT IN ('step', 'python')),
host AS (
    SELECT CAST(e.src_file AS VARCHAR) AS file, e.src_line AS line,
           CAST(sum(e.dur_ns) FILTER (WHERE p.id IS NULL) AS BIGINT) AS host_ns,
           count(*) FILTER (WHERE e.kind = 'op') AS ops,
           CAST(any_value(e.src_func) AS VARCHAR) AS func
    FROM events e LEFT JOIN hp p
      ON e.parent_id = p.id AND p.src_file = e.src_file AND p.src_line = e.src_line
    WHERE e.layer = 'host' AND e.src_file IS NOT NULL AND e.kind NOT IN ('step', 'python')
    GROUP BY 1, 2),
launch AS (
    SELECT flow_id, any_value(src_file) AS src_file, any_value(src_line) AS src_line
    FROM events WHERE layer = 'host' AND flow_id IS NOT NULL AND src_file IS NOT NULL
    GROUP BY flow_id),
dev AS (
    SELECT CAST(coalesce(d.src_file, l.src_file) AS VARCHAR) AS file,
           coalesce(d.src_line, l.src_line) AS line, CAST(sum(d.dur_ns) AS BIGINT) AS device_ns,
           count(*) AS launches
    FROM events d LEFT JOIN launch l ON d.flow_id = l.flow_id
    WHERE d.layer = 'device' AND d.kind IN ({_LAUNCH_SQL})
    GROUP BY 1, 2)
SELECT file, line, coalesce(func, '') AS func, coalesce(host_ns, 0) AS host_ns,
       coalesce(device_ns, 0) AS device_ns, coalesce(ops, 0) AS ops,
       coalesce(launches, 0) AS launches
FROM host FULL OUTER JOIN dev USING (file, line)
WHERE file IS NOT NULL
ORDER BY host_ns + device_ns DESC
"""


def file_id(path: str) -> str:
    """A stable id for a source file path, safe in a URL."""
    return hashlib.sha1(path.encode("utf-8")).hexdigest()[:12]


def line_table(cols: Columns) -> pa.Table:
    """Host and device time per source line: LINES_SQL computed over the profile's event arrays."""
    dur = cols.ints("dur_ns")
    file, files = cols.codes("src_file")
    line, has_line = cols.ints("src_line"), cols.valid("src_line")
    func, funcs = cols.codes("src_func")
    host = cols.where("layer", ("host",))

    # host: each event once, unless its parent sits on the same line
    e = np.flatnonzero(host & (file >= 0) & ~cols.where("kind", ("step", "python")))
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
    rows: list[list] = []  # file, line, func, host_ns, device_ns, ops, launches, has host/device
    on_line: dict[tuple[str, int | None], list] = {}
    for g in range(n):
        r = e[first[g]]
        row = [files[file[r]], int(line[r]) if has_line[r] else None,
               funcs[fn[g]] if fn[g] >= 0 else "", int(host_ns[g]), 0, int(ops[g]), 0,
               counted[g] > 0, False]  # fmt: skip
        rows.append(row)
        if row[1] is not None:
            on_line[(row[0], row[1])] = row

    # device: each launch on its own line, or else on the line of the host call that launched it
    flow, has_flow = cols.ints("flow_id"), cols.valid("flow_id")
    launch = np.flatnonzero(host & has_flow & (file >= 0))
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
        hit = on_line.get((files[dfile[first[g]]], ln)) if ln is not None else None
        if hit is None:
            hit = [files[dfile[first[g]]], ln, "", 0, 0, 0, 0, False, True]
            rows.append(hit)
        hit[4], hit[6], hit[8] = int(device_ns[g]), int(launches[g]), True
    # LINES_SQL orders by host_ns + device_ns before its coalesce: lines with both host and
    # device time first, by that sum; then the rest (NULL sums), here by their time and line
    rows.sort(key=lambda r: (not (r[7] and r[8]), -(r[3] + r[4]), r[0], r[1] is None, r[1] or 0))
    names = ("file", "line", "func", "host_ns", "device_ns", "ops", "launches")
    types = (pa.string(), pa.int32(), pa.string(), *[pa.int64()] * 4)
    return pa.table(
        {
            k: pa.array([r[i] for r in rows], t)
            for i, (k, t) in enumerate(zip(names, types, strict=True))
        }
    )


def _line_key(line: np.ndarray, has_line: np.ndarray) -> np.ndarray:
    """A non-negative group key per line number, 0 for none (NULL lines group together)."""
    return np.where(has_line, line.astype(np.int64) - (int(line.min()) if len(line) else 0) + 1, 0)


def files_json(lines: pa.Table, profile: Profile) -> list[dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for r in lines.to_pylist():
        f = files.setdefault(
            r["file"],
            {"file": r["file"], "file_id": file_id(r["file"]), "host_ns": 0, "device_ns": 0,
             "ops": 0, "lines": 0},
        )  # fmt: skip
        f["host_ns"] += r["host_ns"]
        f["device_ns"] += r["device_ns"]
        f["ops"] += r["ops"]
        f["lines"] += 1
    out = sorted(files.values(), key=lambda f: -(f["host_ns"] + f["device_ns"]))
    for f in out:
        f["has_source"] = read_source(profile, f["file"]) is not None
    return out


def top_lines(lines: pa.Table, n: int = 10) -> list[dict[str, Any]]:
    rows = lines.slice(0, n).to_pylist()
    for r in rows:
        r["file_id"] = file_id(r["file"])
    return rows


def read_source(profile: Profile, path: str) -> str | None:
    """The kept text of `path`, refusing anything that resolves outside the profile's sources/."""
    base = (profile.path / SOURCES).resolve()
    target = (base / source_relpath(path)).resolve()
    if not target.is_relative_to(base) or not target.is_file():
        return None
    try:
        return target.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def find_file(lines: pa.Table, fid: str, model: pa.Table | None = None) -> str | None:
    names = set(lines.column("file").to_pylist())
    if model is not None:
        names.update(model.column("file").to_pylist())
    for f in names:
        if file_id(f) == fid:
            return f
    return None


def model_line_table(profile: Profile, con, level: str = "model") -> pa.Table:
    """Device self and total time per line of every file in the stacks (analysis/hotspots.py):
    at `level` (user, model or all) for the files that level reads, at every frame for the
    rest (torch's files at the user or model level)."""
    every = hotspots.line_hotspots(profile, "all", con)
    if level == "all":
        return every
    chosen = hotspots.line_hotspots(profile, level, con)
    rest = every.filter(pc.invert(pc.is_in(every.column("file"), chosen.column("file"))))
    return pa.concat_tables([chosen, rest])


def model_files_json(model: pa.Table, profile: Profile) -> list[dict[str, Any]]:
    """Files by the device time of their lines: self summed, total of their hottest line."""
    files: dict[str, dict[str, Any]] = {}
    for r in model.to_pylist():
        f = files.setdefault(r["file"], {"file": r["file"], "file_id": file_id(r["file"]),
                                         "self_ns": 0, "total_ns": 0, "lines": 0})  # fmt: skip
        f["self_ns"] += r["self_ns"]
        f["total_ns"] = max(f["total_ns"], r["total_ns"])
        f["lines"] += 1
    out = sorted(files.values(), key=lambda f: (-f["self_ns"], -f["total_ns"]))
    for f in out:
        f["has_source"] = read_source(profile, f["file"]) is not None
    return out


def top_model_lines(model: pa.Table, n: int = 50) -> list[dict[str, Any]]:
    rows = [r for r in model.to_pylist() if r["self_ns"]]
    rows.sort(key=lambda r: -r["self_ns"])
    for r in rows[:n]:
        r["file_id"] = file_id(r["file"])
    return rows[:n]


def file_json(
    profile: Profile, lines: pa.Table, path: str, modeled: bool, model: pa.Table | None = None
) -> dict[str, Any]:
    stats = {r["line"]: r for r in lines.to_pylist() if r["file"] == path}
    work: dict[int, dict[str, Any]] = {}
    if model is not None:
        work = {
            r["line"]: r for r in model.filter(pc.equal(model.column("file"), path)).to_pylist()
        }
    text = read_source(profile, path)
    code = text.splitlines() if text is not None else []
    n = max([len(code), *[k for k in stats if k], *[k for k in work if k]], default=0)
    rows = []
    for i in range(1, n + 1):
        s = stats.get(i, {})
        w = work.get(i, {})
        rows.append({
            "line": i, "code": code[i - 1] if i <= len(code) else None,
            "host_ns": s.get("host_ns", 0), "device_ns": s.get("device_ns", 0),
            "ops": s.get("ops", 0), "launches": s.get("launches", 0),
            "self_ns": w.get("self_ns", 0), "total_ns": w.get("total_ns", 0),
        })  # fmt: skip
    return {
        "file": path,
        "file_id": file_id(path),
        "name": Path(path).name,
        "has_source": text is not None,
        "device_time_modeled": modeled,
        "max_ns": max((r["host_ns"] + r["device_ns"] for r in rows), default=0),
        "max_total_ns": max((r["total_ns"] for r in rows), default=0),
        "lines": rows,
    }


def line_detail(con, path: str, line: int) -> dict[str, Any]:
    """The ops and device work at one line, with a few events to jump to on the timeline."""

    def rows(sql: str) -> list[dict[str, Any]]:
        return fetch_dicts(con, sql, [path, line])

    ops = rows(
        "SELECT CAST(name AS VARCHAR) AS name, CAST(kind AS VARCHAR) AS kind, "
        "CAST(layer AS VARCHAR) AS layer, count(*) AS count, CAST(sum(dur_ns) AS BIGINT) AS total_ns, "
        "min(id) AS first_id FROM events WHERE src_file = ? AND src_line = ? "
        "AND kind NOT IN ('step', 'python') GROUP BY ALL ORDER BY total_ns DESC LIMIT 100"
    )
    events = rows(
        "SELECT id, CAST(name AS VARCHAR) AS name, CAST(kind AS VARCHAR) AS kind, start_ns, "
        "dur_ns, step FROM events WHERE src_file = ? AND src_line = ? AND kind = 'op' "
        "ORDER BY dur_ns DESC LIMIT 20"
    )
    # the device work with this line anywhere in its stack: a library line's kernels too
    kernels = rows(
        f"SELECT e.id, CAST(e.name AS VARCHAR) AS name, CAST(e.kind AS VARCHAR) AS kind, "
        f"CAST(e.module AS VARCHAR) AS module, e.start_ns, e.dur_ns, e.step FROM events e "
        f"WHERE e.kind IN ({_WORK_SQL}) AND e.stack_id IN "
        f"(SELECT stack_id FROM stacks WHERE file = ? AND line = ?) ORDER BY e.dur_ns DESC LIMIT 50"
    )
    return {"file": path, "file_id": file_id(path), "line": line, "ops": ops, "events": events,
            "kernels": kernels}  # fmt: skip

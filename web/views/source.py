"""Source hotspots: files and lines ranked by time, and a file's code annotated line by line with
host time, device time and op count. Code comes from the profile's sources/ folder only."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa

from explorer.model import Profile
from explorer.model.io import SOURCES, source_relpath

from . import fetch_dicts
from .operators import _LAUNCH_SQL

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


def line_table(con) -> pa.Table:
    return con.sql(LINES_SQL).to_arrow_table()


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


def find_file(lines: pa.Table, fid: str) -> str | None:
    for f in set(lines.column("file").to_pylist()):
        if file_id(f) == fid:
            return f
    return None


def file_json(profile: Profile, lines: pa.Table, path: str, modeled: bool) -> dict[str, Any]:
    stats = {r["line"]: r for r in lines.to_pylist() if r["file"] == path}
    text = read_source(profile, path)
    code = text.splitlines() if text is not None else []
    n = max([len(code), *[k for k in stats if k]], default=0)
    rows = []
    for i in range(1, n + 1):
        s = stats.get(i, {})
        rows.append({
            "line": i, "code": code[i - 1] if i <= len(code) else None,
            "host_ns": s.get("host_ns", 0), "device_ns": s.get("device_ns", 0),
            "ops": s.get("ops", 0), "launches": s.get("launches", 0),
        })  # fmt: skip
    return {
        "file": path,
        "file_id": file_id(path),
        "name": Path(path).name,
        "has_source": text is not None,
        "device_time_modeled": modeled,
        "max_ns": max((r["host_ns"] + r["device_ns"] for r in rows), default=0),
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
    return {"file": path, "file_id": file_id(path), "line": line, "ops": ops, "events": events}

"""The operator page: framework ops with their host and device time, FLOPs and bytes, a roofline
against the device spec, and one op's kernels, instructions and source lines. The operator
table is written once, here, over numpy arrays; the summary's top ops are cut from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..model.profile import Profile
from ..vocab.device_spec import SpecFigures
from ..vocab.kinds import LAUNCHED_KINDS
from .columns import Columns, children_ns, group_sum, groups
from .page import PageModel, fetch_rows, is_modeled

# device events that stand for a whole launch (instructions and DMAs sit under kernels)
LAUNCH_KINDS = LAUNCHED_KINDS
LAUNCH_SQL = ", ".join(f"'{k}'" for k in LAUNCH_KINDS)
DETAIL_ROWS = 200  # kernels and instructions listed for one op
DETAIL_LINES = 50


def operator_table(cols: Columns) -> pa.Table:
    """One row per framework op name (host ops, plus ops known only as launchers of device
    work): count, host self and total time, launches, device time, FLOPs and bytes (a 1M-event
    profile in tens of ms). Host self time is the op's time minus its direct children's."""
    dur, flops = cols.ints("dur_ns"), cols.ints("flops")
    moved = cols.ints("bytes_read") + cols.ints("bytes_written")
    out: dict[str, list[int]] = {}  # name -> count, total, self, flops, bytes, launches, ns, ...

    ops = np.flatnonzero(cols.where("layer", ("host",)) & cols.where("kind", ("op",)))
    self_ns = np.maximum(dur[ops] - children_ns(cols, ops), 0)
    name, names = cols.codes("name")
    first, group, n = groups(name[ops] + 1)
    sums = [group_sum(group, v, n) for v in (dur[ops], self_ns, flops[ops], moved[ops])]
    count = np.bincount(group, minlength=n)
    for g in range(n):
        out[names[name[ops[first[g]]]]] = [int(count[g]), *(int(v[g]) for v in sums), 0, 0, 0, 0]

    op_name, op_names = cols.codes("op_name")
    dev = np.flatnonzero(
        cols.where("layer", ("device",)) & cols.where("kind", LAUNCH_KINDS) & (op_name >= 0)
    )
    first, group, n = groups(op_name[dev])
    sums = [group_sum(group, v, n) for v in (dur[dev], flops[dev], moved[dev])]
    launches = np.bincount(group, minlength=n)
    for g in range(n):
        row = out.setdefault(op_names[op_name[dev[first[g]]]], [0] * 9)
        row[5:9] = [int(launches[g]), *(int(v[g]) for v in sums)]
    # ops with both host calls and launches first, by host self plus device time; then the
    # rest by their time and name (the order of the reference SQL in tests/reference_sql.py)
    rows = sorted(
        out.items(), key=lambda kv: (not (kv[1][0] and kv[1][5]), -(kv[1][6] + kv[1][2]), kv[0])
    )
    # count, host total, host self, host flops, host bytes, launches, device ns, flops, bytes
    col = list(zip(*(r for _, r in rows), strict=True)) if rows else [()] * 9
    return pa.table(
        {
            "name": pa.array([k for k, _ in rows], pa.string()),
            "count": pa.array(col[0], pa.int64()),
            "host_self_ns": pa.array(col[2], pa.int64()),
            "host_total_ns": pa.array(col[1], pa.int64()),
            "launches": pa.array(col[5], pa.int64()),
            "device_ns": pa.array(col[6], pa.int64()),
            "flops": pa.array([h if h > 0 else d for h, d in zip(col[3], col[7], strict=True)],
                              pa.int64()),
            "bytes": pa.array([d if d > 0 else h for h, d in zip(col[4], col[8], strict=True)],
                              pa.int64()),
        }
    )  # fmt: skip


def top_host_ops(table: pa.Table, by: str, n: int) -> pa.Table:
    """The summary's top host ops (name, calls, self_ns, total_ns) by `by` (self_ns or
    total_ns), cut from the operator table so the two pages agree by construction."""
    import pyarrow.compute as pc

    host = table.filter(pc.greater(table["count"], 0))
    top = pa.table({"name": host["name"], "calls": host["count"],
                    "self_ns": host["host_self_ns"], "total_ns": host["host_total_ns"]})  # fmt: skip
    return top.sort_by([(by, "descending"), ("name", "ascending")]).slice(0, n)


def device_peaks(spec: dict[str, Any] | None) -> tuple[float | None, float | None]:
    """(peak FLOP/s, memory bytes/s) of a manifest's device_spec (a DeviceSpec.to_dict())."""
    figures = SpecFigures.from_dict(spec)
    return figures.peak_flops_bf16, figures.memory_bytes_per_s or figures.hbm_bytes_per_s


@dataclass(frozen=True)
class Roofline:
    peak_flops_per_s: float
    peak_bytes_per_s: float


@dataclass(frozen=True)
class Operators(PageModel):
    """Every op by host self plus device time, with its arithmetic intensity (FLOPs per byte)
    and achieved FLOP/s on the device, and the device's roofline when its spec is known."""

    device_time_modeled: bool
    operators: tuple[dict[str, Any], ...]
    roofline: Roofline | None


def operators_page(
    table: pa.Table, spec: dict[str, Any] | None, modeled: bool, top: int | None = None
) -> Operators:
    """The operator page of an operator table (the web caches the table per profile)."""
    rows = table.to_pylist() if top is None else table.slice(0, top).to_pylist()
    for r in rows:
        r["intensity"] = r["flops"] / r["bytes"] if r["flops"] and r["bytes"] else None
        r["achieved_flops_per_s"] = (
            r["flops"] / (r["device_ns"] * 1e-9) if r["flops"] and r["device_ns"] else None
        )
    peak_flops, peak_bw = device_peaks(spec)
    roof = Roofline(peak_flops, peak_bw) if peak_flops and peak_bw else None
    return Operators(modeled, tuple(rows), roof)


def operators(profile: Profile, top: int | None = None) -> Operators:
    """The operator page of `profile` (the `operators` command, /api/p/NAME/operators)."""
    from .context import context

    ctx = context(profile)
    with ctx.lock:
        table = operator_table(ctx.cols)
    return operators_page(table, profile.manifest.device_spec, is_modeled(profile), top)


@dataclass(frozen=True)
class OperatorDetail(PageModel):
    """What one op launched: its kernels, the instructions and DMAs under them, its lines."""

    op: str
    kernels: tuple[dict[str, Any], ...]
    instructions: tuple[dict[str, Any], ...]
    lines: tuple[dict[str, Any], ...]


def operator_detail(con, op: str) -> OperatorDetail:
    """The kernels, instructions and source lines of the op named `op` (a DuckDB connection
    over the profile's tables)."""

    def rows(sql: str) -> tuple[dict[str, Any], ...]:
        return fetch_rows(con, sql, [op])

    bytes_sql = "CAST(sum(coalesce(bytes_read,0) + coalesce(bytes_written,0)) AS BIGINT) AS bytes"
    head = ("SELECT CAST(name AS VARCHAR) AS name, CAST(kind AS VARCHAR) AS kind, "
            "CAST(track AS VARCHAR) AS track, count(*) AS count, "
            "CAST(sum(dur_ns) AS BIGINT) AS total_ns")  # fmt: skip
    kernels = rows(
        f"{head}, CAST(sum(flops) AS BIGINT) AS flops, {bytes_sql}, min(id) AS first_id, "
        f"min(start_ns) AS first_start_ns FROM events WHERE layer = 'device' "
        f"AND kind IN ({LAUNCH_SQL}) AND op_name = ? "
        f"GROUP BY ALL ORDER BY total_ns DESC, name, kind, track LIMIT {DETAIL_ROWS}"
    )
    instructions = rows(
        f"{head}, {bytes_sql} FROM events WHERE layer = 'device' "
        f"AND kind IN ('instruction', 'dma') AND op_name = ? "
        f"GROUP BY ALL ORDER BY total_ns DESC, name, kind, track LIMIT {DETAIL_ROWS}"
    )
    lines = rows(
        "SELECT CAST(src_file AS VARCHAR) AS file, src_line AS line, "
        "CAST(any_value(src_func) AS VARCHAR) AS func, count(*) AS count, "
        "CAST(sum(dur_ns) AS BIGINT) AS total_ns, min(id) AS first_id, "
        "min(start_ns) AS first_start_ns FROM events WHERE op_name = ? "
        f"AND src_file IS NOT NULL AND kind = 'op' "
        f"GROUP BY ALL ORDER BY total_ns DESC, file, line LIMIT {DETAIL_LINES}"
    )
    return OperatorDetail(op, kernels, instructions, lines)

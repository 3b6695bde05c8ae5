"""Framework operators with their host and device time, FLOPs and bytes, expanding into the
kernels and instructions they launched; and a roofline of the ops against the device spec."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from neuron_explorer.analysis.columns import Columns, children_ns, group_sum, groups

from . import fetch_dicts

# device events that stand for a whole launch (instructions and DMAs sit under kernels)
LAUNCH_KINDS = ("kernel", "gpu_kernel", "gpu_memcpy", "gpu_memset", "collective")
_LAUNCH_SQL = ", ".join(f"'{k}'" for k in LAUNCH_KINDS)

# The operator table's definition; operator_table computes the same over numpy arrays (a test
# checks that they agree on real profiles).
OPS_SQL = f"""
WITH child AS (
    SELECT parent_id, CAST(sum(dur_ns) AS BIGINT) AS d FROM events
    WHERE layer = 'host' AND parent_id IS NOT NULL GROUP BY parent_id),
host AS (
    SELECT CAST(o.name AS VARCHAR) AS name, count(*) AS count, CAST(sum(o.dur_ns) AS BIGINT) AS host_total_ns,
           CAST(sum(greatest(o.dur_ns - coalesce(c.d, 0), 0)) AS BIGINT) AS host_self_ns,
           CAST(sum(o.flops) AS BIGINT) AS host_flops,
           CAST(sum(coalesce(o.bytes_read, 0) + coalesce(o.bytes_written, 0)) AS BIGINT) AS host_bytes
    FROM events o LEFT JOIN child c ON c.parent_id = o.id
    WHERE o.kind = 'op' AND o.layer = 'host' GROUP BY 1),
dev AS (
    SELECT CAST(op_name AS VARCHAR) AS name, count(*) AS launches, CAST(sum(dur_ns) AS BIGINT) AS device_ns,
           CAST(sum(flops) AS BIGINT) AS dev_flops,
           CAST(sum(coalesce(bytes_read, 0) + coalesce(bytes_written, 0)) AS BIGINT) AS dev_bytes
    FROM events WHERE layer = 'device' AND kind IN ({_LAUNCH_SQL}) AND op_name IS NOT NULL
    GROUP BY 1)
SELECT name, coalesce(count, 0) AS count, coalesce(host_self_ns, 0) AS host_self_ns,
       coalesce(host_total_ns, 0) AS host_total_ns, coalesce(launches, 0) AS launches,
       coalesce(device_ns, 0) AS device_ns,
       CASE WHEN coalesce(host_flops, 0) > 0 THEN host_flops ELSE coalesce(dev_flops, 0) END AS flops,
       CASE WHEN coalesce(dev_bytes, 0) > 0 THEN dev_bytes ELSE coalesce(host_bytes, 0) END AS bytes
FROM host FULL OUTER JOIN dev USING (name)
ORDER BY device_ns + host_self_ns DESC
"""


def operator_table(cols: Columns) -> pa.Table:
    """One row per framework op name (host ops, plus ops known only as launchers of device work):
    OPS_SQL computed over the profile's event arrays (a 1M-event profile in tens of ms)."""
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
    # OPS_SQL orders by device_ns + host_self_ns before its coalesce: ops with both host calls
    # and launches first, by that sum; then the rest (NULL sums), here by their time and name
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


def device_peaks(spec: dict[str, Any] | None) -> tuple[float | None, float | None]:
    """(peak FLOP/s, memory bytes/s) of a manifest's device_spec (a DeviceSpec.to_dict())."""
    if not spec:
        return None, None
    num = {k: float(v) for k, v in spec.items() if isinstance(v, (int, float))}
    flops = num.get("peak_flops_bf16") or num.get("peak_flops")
    bw = num.get("memory_bytes_per_s") or num.get("hbm_bytes_per_s")
    return flops, bw


def operators_json(table: pa.Table, spec: dict[str, Any] | None, modeled: bool) -> dict[str, Any]:
    rows = table.to_pylist()
    for r in rows:
        r["intensity"] = r["flops"] / r["bytes"] if r["flops"] and r["bytes"] else None
        r["achieved_flops_per_s"] = (
            r["flops"] / (r["device_ns"] * 1e-9) if r["flops"] and r["device_ns"] else None
        )
    peak_flops, peak_bw = device_peaks(spec)
    return {
        "device_time_modeled": modeled,
        "operators": rows,
        "roofline": {"peak_flops_per_s": peak_flops, "peak_bytes_per_s": peak_bw}
        if peak_flops and peak_bw
        else None,
    }


def operator_detail(con, op: str) -> dict[str, Any]:
    """The kernels an op launched, the instructions and DMAs under them, and its source lines."""

    def rows(sql: str) -> list[dict[str, Any]]:
        return fetch_dicts(con, sql, [op])

    kernels = rows(
        "SELECT CAST(name AS VARCHAR) AS name, CAST(kind AS VARCHAR) AS kind, "
        "CAST(track AS VARCHAR) AS track, count(*) AS count, CAST(sum(dur_ns) AS BIGINT) AS total_ns, "
        "CAST(sum(flops) AS BIGINT) AS flops, CAST(sum(coalesce(bytes_read,0) + coalesce(bytes_written,0)) AS BIGINT) AS bytes, "
        "min(id) AS first_id, min(start_ns) AS first_start_ns FROM events "
        f"WHERE layer = 'device' AND kind IN ({_LAUNCH_SQL}) AND op_name = ? "
        "GROUP BY ALL ORDER BY total_ns DESC LIMIT 200"
    )
    instructions = rows(
        "SELECT CAST(name AS VARCHAR) AS name, CAST(kind AS VARCHAR) AS kind, "
        "CAST(track AS VARCHAR) AS track, count(*) AS count, CAST(sum(dur_ns) AS BIGINT) AS total_ns, "
        "CAST(sum(coalesce(bytes_read,0) + coalesce(bytes_written,0)) AS BIGINT) AS bytes FROM events "
        "WHERE layer = 'device' AND kind IN ('instruction', 'dma') AND op_name = ? "
        "GROUP BY ALL ORDER BY total_ns DESC LIMIT 200"
    )
    lines = rows(
        "SELECT CAST(src_file AS VARCHAR) AS file, src_line AS line, "
        "CAST(any_value(src_func) AS VARCHAR) AS func, count(*) AS count, "
        "CAST(sum(dur_ns) AS BIGINT) AS total_ns, min(id) AS first_id, min(start_ns) AS first_start_ns "
        "FROM events WHERE op_name = ? AND src_file IS NOT NULL AND kind = 'op' "
        "GROUP BY ALL ORDER BY total_ns DESC LIMIT 50"
    )
    return {"op": op, "kernels": kernels, "instructions": instructions, "lines": lines}

"""The reference definitions of the operator and line tables, in SQL: neuron_explorer.analysis
computes both over numpy arrays (operators.operator_table, lines.line_table), and tests check
that the two agree on real profiles (an independent check of the fast code)."""

from __future__ import annotations

LAUNCH_KINDS = ("kernel", "gpu_kernel", "gpu_memcpy", "gpu_memset", "collective")
_LAUNCH_SQL = ", ".join(f"'{k}'" for k in LAUNCH_KINDS)

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

"""Which layer, which line: device time by nn.Module path (a tree) and by source line at the
level the reader chooses (docs/format.md "Attribution").

The work measured is device work (kernels, GPU kernels, memcpy/memset, collectives); a profile
without any (a CPU-only trace) measures its outermost host ops instead. Backward work is told
apart by the capture's `backward` flag (it carries its forward op's module and stack).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from ..model.profile import Profile
from ..vocab.kinds import LAUNCHED_KINDS
from .findings import Finding, Hotspot
from .page import PageModel, is_modeled

CITED = 5  # model lines and modules cited per finding

DEVICE_WORK = LAUNCHED_KINDS  # device work charged to its launching op
LEVELS = ("user", "model", "all")
# Which frames each level reads: the user's code, model code (user or library: outside torch
# and the standard library), or every frame.
LEVEL_SCOPES = {"user": ("user",), "model": ("user", "library"), "all": None}
LEVEL_COLUMNS = {"user": "src", "model": "model"}
ROOT_LABEL = "(model)"  # the module path "" : the model's own forward
AUTOGRAD_NODE = "autograd::engine::evaluate_function: "  # torch.profiler's backward node span


def _work_sql(con) -> str:
    """The rows measured: (id, dur_ns, stack_id, module, src_*, model_*, backward)."""
    kinds = ", ".join(f"'{k}'" for k in DEVICE_WORK)
    has_device = con.execute(f"SELECT count(*) FROM events WHERE kind IN ({kinds})").fetchall()[0][
        0
    ]
    backward = "coalesce(args LIKE '%\"backward\": true%', false)"
    if has_device:
        where = f"kind IN ({kinds})"
    else:  # outermost ops; autograd's evaluate_function wrapper stands for the node inside it
        where = f"""kind = 'op' AND NOT starts_with(name, '{AUTOGRAD_NODE}') AND (parent_id IS NULL
            OR parent_id NOT IN (SELECT id FROM events WHERE kind = 'op'
                                 AND NOT starts_with(name, '{AUTOGRAD_NODE}')))"""
        backward = f"""({backward} OR parent_id IN (SELECT id FROM events
                        WHERE kind = 'op' AND starts_with(name, '{AUTOGRAD_NODE}')))"""
    return f"""SELECT id, dur_ns, stack_id, CAST(module AS VARCHAR) AS module,
        CAST(src_file AS VARCHAR) AS src_file, src_line, CAST(src_func AS VARCHAR) AS src_func,
        CAST(model_file AS VARCHAR) AS model_file, model_line,
        CAST(model_func AS VARCHAR) AS model_func, {backward} AS backward
        FROM events WHERE {where}"""


@dataclass(frozen=True)
class ModuleNode:
    """One module of the tree: its own work and its subtree's, forward and backward apart."""

    path: str
    depth: int
    self_ns: int = 0
    total_ns: int = 0
    forward_ns: int = 0
    backward_ns: int = 0
    calls: int = 0  # forward passes: runs of its forward work in launch order
    kernels: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "label": self.path or ROOT_LABEL}


def _ancestors(path: str) -> list[str]:
    """`a.b.c` -> ["", "a", "a.b", "a.b.c"]: every dotted prefix is itself a module's path."""
    parts = path.split(".") if path else []
    return ["", *(".".join(parts[: i + 1]) for i in range(len(parts)))]


def module_tree(profile: Profile, con=None) -> list[ModuleNode]:
    """Every module with work under it, parents before children, heaviest subtree first."""
    con = con or profile.duckdb()
    rows = con.execute(
        f"SELECT id, dur_ns, module, backward FROM ({_work_sql(con)}) ORDER BY id"
    ).fetchall()
    acc: dict[str, list[int]] = {}  # path -> [self, total, fwd, bwd, calls, kernels]
    open_runs: set[str] = set()
    for _id, dur, module, backward in rows:
        if module is None:  # work outside any module (an optimizer step) ends every call
            open_runs = open_runs if backward else set()
            continue
        chain = _ancestors(module)
        for p in chain:
            a = acc.setdefault(p, [0, 0, 0, 0, 0, 0])
            a[1] += dur
            a[3 if backward else 2] += dur
            a[5] += 1
        acc[module][0] += dur
        if not backward:  # a call starts where its forward work was not running just before
            now = set(chain)
            for p in now - open_runs:
                acc[p][4] += 1
            open_runs = now
    nodes = {
        p: ModuleNode(p, len(_ancestors(p)) - 1, *a)  # type: ignore[arg-type]
        for p, a in acc.items()
    }
    out: list[ModuleNode] = []

    def visit(path: str) -> None:
        out.append(nodes[path])
        kids = [p for p in nodes if p and _parent(p) == path]
        for k in sorted(kids, key=lambda p: -nodes[p].total_ns):
            visit(k)

    if "" in nodes:
        visit("")
    return out


def module_ops(profile: Profile, con=None) -> list[dict]:
    """Each module's own work by op and kernel: (module, op, kernel, dur_ns, count), the levels
    under a module in the tree (their times add up to the module's self time)."""
    con = con or profile.duckdb()
    kinds = ", ".join(f"'{k}'" for k in DEVICE_WORK)
    rows = con.execute(
        f"""SELECT CAST(module AS VARCHAR), CAST(coalesce(op_name, name) AS VARCHAR),
                   CAST(name AS VARCHAR), CAST(sum(dur_ns) AS BIGINT), count(*)
            FROM events WHERE kind IN ({kinds}) AND module IS NOT NULL
            GROUP BY ALL ORDER BY 4 DESC, 1, 2, 3"""
    ).fetchall()
    keys = ("module", "op", "kernel", "dur_ns", "count")
    return [dict(zip(keys, r, strict=True)) for r in rows]


@dataclass(frozen=True)
class Modules(PageModel):
    """The modules page and the `modules` command: the tree, parents before children, and
    each module's own work by op and kernel."""

    modules: tuple[ModuleNode, ...]
    ops: tuple[dict, ...]
    device_time_modeled: bool


def modules_page(profile: Profile, con=None, depth: int | None = None) -> Modules:
    """The module tree of `profile` (down to `depth` when given) and its modules' ops."""
    con = con or profile.duckdb()
    nodes = [m for m in module_tree(profile, con) if depth is None or m.depth <= depth]
    return Modules(tuple(nodes), tuple(module_ops(profile, con)), is_modeled(profile))


@dataclass(frozen=True)
class Lines(PageModel):
    """The `lines` command: the lines with the most device self time at `level`."""

    level: str
    lines: tuple[dict, ...]


def lines_page(
    profile: Profile, level: str = "model", file: str | None = None, top: int | None = None,
    con=None,
) -> Lines:  # fmt: skip
    """The lines of `profile` at `level` (only those of `file` when given), `top` of them."""
    rows = line_hotspots(profile, level, con, file=file).to_pylist()
    return Lines(level, tuple(rows if top is None else rows[:top]))


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def line_hotspots(profile: Profile, level: str = "model", con=None, file: str | None = None):
    """Device time per source line at `level`: self (the line is the innermost frame of that
    level) and total (the line is anywhere in the work's stack at that level), forward and
    backward apart. Ordered by self time, then total."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}")
    con = con or profile.duckdb()
    work = _work_sql(con)
    scopes = LEVEL_SCOPES[level]
    scope_sql = "TRUE" if scopes is None else f"scope IN ({', '.join(repr(s) for s in scopes)})"
    if level in LEVEL_COLUMNS:
        c = LEVEL_COLUMNS[level]
        inner = f"SELECT id, dur_ns, backward, {c}_file AS file, {c}_line AS line, {c}_func AS func FROM w"
    else:  # every frame: the innermost frame of the stack that has a line (not a builtin)
        inner = """SELECT w.id, w.dur_ns, w.backward, CAST(s.file AS VARCHAR) AS file,
            s.line, CAST(s.function AS VARCHAR) AS func
            FROM w JOIN (SELECT stack_id, arg_min(depth, depth) AS depth FROM stacks
                         WHERE line IS NOT NULL GROUP BY 1) i ON i.stack_id = w.stack_id
            JOIN stacks s ON s.stack_id = i.stack_id AND s.depth = i.depth"""
    file_filter = "WHERE file = $file" if file is not None else ""
    sql = f"""
    WITH w AS ({work}),
    self AS (SELECT file, line, any_value(func) AS func, sum(dur_ns) AS self_ns,
                    count(*) AS kernels FROM ({inner}) WHERE file IS NOT NULL GROUP BY 1, 2),
    frames AS (SELECT DISTINCT w.id, w.dur_ns, w.backward, CAST(s.file AS VARCHAR) AS file,
                      s.line, CAST(s.function AS VARCHAR) AS func
               FROM w JOIN stacks s ON s.stack_id = w.stack_id WHERE {scope_sql}),
    total AS (SELECT file, line, any_value(func) AS func, sum(dur_ns) AS total_ns,
                     sum(dur_ns) FILTER (WHERE NOT backward) AS forward_ns,
                     sum(dur_ns) FILTER (WHERE backward) AS backward_ns,
                     count(*) AS work FROM frames GROUP BY 1, 2)
    SELECT * FROM (
      SELECT file, line, coalesce(self.func, total.func, '') AS func,
             CAST(coalesce(self_ns, 0) AS BIGINT) AS self_ns,
             CAST(greatest(coalesce(total_ns, 0), coalesce(self_ns, 0)) AS BIGINT) AS total_ns,
             CAST(coalesce(forward_ns, 0) AS BIGINT) AS forward_ns,
             CAST(coalesce(backward_ns, 0) AS BIGINT) AS backward_ns,
             CAST(coalesce(kernels, 0) AS BIGINT) AS self_count,
             CAST(coalesce(work, kernels, 0) AS BIGINT) AS total_count
      FROM self FULL OUTER JOIN total USING (file, line)) {file_filter}
    ORDER BY self_ns DESC, total_ns DESC, file, line
    """
    params = {"file": file} if file is not None else None
    return con.sql(sql, params=params).to_arrow_table()


def top_lines(profile: Profile, level: str = "model", n: int = 10, con=None) -> list[dict]:
    """The `n` lines with the most self time at `level`."""
    return [r for r in line_hotspots(profile, level, con).to_pylist() if r["self_ns"]][:n]


def top_modules(profile: Profile, n: int = 10, con=None) -> list[dict]:
    """The `n` modules with the most self time (their own forward's work and its backward)."""
    nodes = sorted(module_tree(profile, con), key=lambda m: -m.self_ns)
    return [m.to_dict() for m in nodes if m.self_ns][:n]


def stack_of(profile: Profile, event_id: int, con=None) -> list[dict]:
    """The whole stack of one event (innermost first), with each frame's scope."""
    con = con or profile.duckdb()
    rows = con.sql(
        """SELECT s.depth, CAST(s.file AS VARCHAR) AS file, s.line,
                  CAST(s.function AS VARCHAR) AS function, CAST(s.scope AS VARCHAR) AS scope
           FROM events e JOIN stacks s ON s.stack_id = e.stack_id
           WHERE e.id = $id ORDER BY s.depth""",
        params={"id": int(event_id)},
    ).to_arrow_table()
    return rows.to_pylist()


def as_table(nodes: list[ModuleNode]) -> pa.Table:
    return pa.Table.from_pylist([m.to_dict() for m in nodes])


def cite_model(profile: Profile, findings: list[Finding], con=None) -> list[Finding]:
    """Each finding's evidence gains the model lines and modules of its evidence events (and
    of the device work those events launched), heaviest first: the line of the model library
    and the layer where the problem is, not only the script line."""
    wanted = [f for f in findings if f.evidence.event_ids]
    if not wanted:
        return findings
    con = con or profile.duckdb()
    out = []
    for f in findings:
        if not f.evidence.event_ids:
            out.append(f)
            continue
        lines, modules = _cited(con, f.evidence.event_ids)
        out.append(replace(f, evidence=replace(f.evidence, model_lines=lines, modules=modules)))
    return out


# the device work a launch makes, not its parts (a neuron kernel's instructions and DMA
# transfers share its flow: counted too, a line's kernels and time came out about 3x)
_LAUNCHED_SQL = "(" + ", ".join(f"'{k}'" for k in LAUNCHED_KINDS) + ")"


def _cited(con, event_ids: tuple[int, ...]) -> tuple[tuple[Hotspot, ...], tuple[Hotspot, ...]]:
    ids = ", ".join(str(int(i)) for i in event_ids[:10_000])
    base = f"""WITH picked AS (SELECT id, flow_id FROM events WHERE id IN ({ids})),
        rows AS (SELECT e.dur_ns, CAST(e.model_file AS VARCHAR) AS file, e.model_line AS line,
                        CAST(e.model_func AS VARCHAR) AS func, CAST(e.module AS VARCHAR) AS module
                 FROM events e WHERE e.id IN (SELECT id FROM picked)
                    OR (e.layer = 'device' AND e.kind IN {_LAUNCHED_SQL} AND e.flow_id IN
                        (SELECT flow_id FROM picked WHERE flow_id IS NOT NULL)))"""
    lines = con.execute(
        f"""{base} SELECT file, line, any_value(func), CAST(sum(dur_ns) AS BIGINT), count(*)
            FROM rows WHERE file IS NOT NULL GROUP BY 1, 2 ORDER BY 4 DESC, 1, 2 LIMIT {CITED}"""
    ).fetchall()
    modules = con.execute(
        f"""{base} SELECT module, CAST(sum(dur_ns) AS BIGINT), count(*) FROM rows
            WHERE module IS NOT NULL GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {CITED}"""
    ).fetchall()
    return (
        tuple(Hotspot(f"{f}:{n}", int(d or 0), int(c), f, n, fn) for f, n, fn, d, c in lines),
        tuple(Hotspot(m or ROOT_LABEL, int(d or 0), int(c)) for m, d, c in modules),
    )

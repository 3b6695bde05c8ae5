"""tensor-engine-padding: matmul dims that waste rows and columns of the 128x128 TensorE."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..context import AnalysisContext
from ..findings import Evidence, Hotspot
from ..replay_saving import Replayed
from ..rule import Draft, Rule, fmt_ms, fmt_pct
from ..shapes import MATMUL_OP_SQL, matmul_dims

MATMUL = (
    "layer = 'device' AND kind = 'kernel' "
    f"AND (json_extract(args, '$.matmul') IS NOT NULL OR {MATMUL_OP_SQL})"
)


def _dims(op: str | None, shapes: str | None, mm: str | None) -> tuple[int, int, int] | None:
    if mm:
        try:
            d = json.loads(mm)
            return int(d["m"]), int(d["k"]), int(d.get("n", 1))
        except (ValueError, KeyError, TypeError):
            pass
    return matmul_dims(op, shapes)


def _pad(x: int, t: int) -> int:
    return -(-x // t) * t


def _sql_text(value: str | None) -> str:
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class Wasteful:
    """One (op, shapes) group of matmuls whose tiles are partly empty."""

    wasted_ns: float  # duration x waste
    waste: float
    dims: tuple[int, int, int]  # M, K, N
    op: str
    dur_ns: int
    count: int
    ids: tuple[int, ...]  # its longest kernels
    file: str | None
    line: int | None
    shapes: str | None = None  # the group's key, with op and mm: its kernels in SQL
    mm: str | None = None

    @property
    def where(self) -> str:
        """Its kernels, as an SQL condition over `ev` (within MATMUL)."""
        return (
            f"(coalesce(op_name, name) = {_sql_text(self.op)} AND shapes IS NOT DISTINCT FROM "
            f"{_sql_text(self.shapes)} AND json_extract(args, '$.matmul')::VARCHAR IS NOT "
            f"DISTINCT FROM {_sql_text(self.mm)})"
        )


@dataclass(frozen=True)
class Tiles:
    tile: int  # the TensorE array's size T
    matmul_ns: int
    groups: tuple[Wasteful, ...]  # waste of MIN_WASTE or more, the most wasted time first
    wasted_ns: float  # theirs, summed


class TensorEnginePadding(Rule[Tiles]):
    """Matmuls whose dimensions are not multiples of the TensorE array size.

    Pattern: TensorE is a 128x128 systolic array: the contraction dim K maps onto its 128
    partitions and the output rows M onto its 128 columns (N streams through). A dim of 130
    uses two tiles, the second almost empty.
    Algorithm: neuron matmul kernels (op_name mm/addmm/bmm/matmul/linear, or args.matmul
    {m, k, n}), grouped by op and input shapes in SQL; (M, K, N) comes from args.matmul or the
    shapes. With T = the spec's tensor_engine_dim (128), the used share of the tiles is
    (M*K) / (ceil(M/T)*T * ceil(K/T)*T) and the waste is 1 minus it. Groups with waste >=
    MIN_WASTE count; report when their wasted time (duration x waste) is at least MIN_SHARE of
    matmul time. The saving is a replay: those kernels' time cut to their used share (duration
    x (1 - waste)), so a step that the host, not TensorE, sets saves little of it.
    """

    id = "tensor-engine-padding"
    title = "TensorE tiles wasted by matmul shapes"
    severity = "low"
    scope = "neuron"
    MIN_WASTE = 0.10
    MIN_SHARE = 0.05
    fix = (
        "Choose model dimensions (hidden size, heads x head_dim, batch x sequence) that are "
        "multiples of 128, or pad them up to the next multiple once, outside the step."
    )

    def measure(self, ctx: AnalysisContext) -> Tiles:
        t = int(ctx.spec.tensor_engine_dim or 128)
        groups = ctx.rows(
            f"""SELECT coalesce(op_name, name) AS op, shapes,
                   json_extract(args, '$.matmul')::VARCHAR AS mm, sum(dur_ns) AS dur_ns,
                   count(*) AS count, list(id ORDER BY dur_ns DESC)[1:5] AS ids,
                   any_value(src_file) AS file, any_value(src_line) AS line
            FROM {ctx.events_of(("kernel",), "device")} WHERE {MATMUL} GROUP BY 1, 2, 3"""
        )
        wasteful = []
        for g in groups:  # one row per distinct (op, shapes): a handful, not per event
            dims = _dims(g["op"], g["shapes"], g["mm"])
            if dims is None:
                continue
            m, k, _ = dims
            waste = 1 - (m * k) / (_pad(m, t) * _pad(k, t))
            if waste >= self.MIN_WASTE:
                wasteful.append(
                    Wasteful(
                        wasted_ns=int(g["dur_ns"]) * waste,
                        waste=waste,
                        dims=dims,
                        op=str(g["op"]),
                        dur_ns=int(g["dur_ns"]),
                        count=int(g["count"]),
                        ids=tuple(int(i) for i in g["ids"]),
                        file=g["file"],
                        line=None if g["line"] is None else int(g["line"]),
                        shapes=g["shapes"],
                        mm=g["mm"],
                    )
                )
        wasted = sum(w.wasted_ns for w in wasteful)  # summed in query order, then ranked
        wasteful.sort(key=lambda w: -w.wasted_ns)
        return Tiles(t, sum(int(g["dur_ns"]) for g in groups), tuple(wasteful), wasted)

    def gate(self, facts: Tiles) -> bool:
        return facts.matmul_ns > 0 and facts.wasted_ns >= self.MIN_SHARE * facts.matmul_ns

    def explain(self, facts: Tiles, evidence: Evidence) -> Draft:
        t, wasted, total = facts.tile, facts.wasted_ns, facts.matmul_ns
        ops = tuple(
            Hotspot(
                label=f"{g.op} {g.dims[0]}x{g.dims[1]}x{g.dims[2]}",
                dur_ns=g.dur_ns,
                count=g.count,
                file=g.file,
                line=g.line,
                note=f"waste {100 * g.waste:.1f}%, pad M x K to {_pad(g.dims[0], t)} x "
                f"{_pad(g.dims[1], t)}",
            )
            for g in facts.groups[:5]
        )
        lines = tuple(
            Hotspot(
                label=f"{h.file}:{h.line}", dur_ns=h.dur_ns, count=h.count, file=h.file,
                line=h.line, note=h.label,
            )
            for h in ops
            if h.file
        )  # fmt: skip
        return Draft(
            title=f"Matmul shapes waste {fmt_pct(wasted / total)} of TensorE time "
            f"({fmt_ms(wasted)})",
            detail=(
                f"Matmuls with dims that are not multiples of {t} leave parts of the "
                f"{t}x{t} array idle: {fmt_ms(wasted)} of {fmt_ms(total)} matmul time is "
                "spent on padding."
            ),
            saving_ns=wasted,
            evidence=Evidence(
                event_ids=tuple(i for g in facts.groups[:5] for i in g.ids),
                ops=ops,
                source_lines=lines,
                metrics={"wasted_ns": round(wasted), "matmul_ns": total, "tile": t},
            ),
            change=Replayed(
                f"these {sum(g.count for g in facts.groups)} matmuls without their padded "
                "tiles (each one's time cut to the share of the tiles it uses)",
                f"{MATMUL} AND ({' OR '.join(g.where for g in facts.groups)})",
                "set",
                dur_sql="CAST(round(dur_ns * CASE "
                + " ".join(f"WHEN {g.where} THEN {1 - g.waste!r}" for g in facts.groups)
                + " ELSE 1 END) AS BIGINT)",
            ),
        )

"""Interval arithmetic over Arrow tables: the lanes named by partition columns, the algorithms
the vocabulary's (vocab/intervals.py: merging spans into disjoint ones per lane, the time they
cover inside windows, the gaps they leave)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..vocab import intervals as vocab_intervals
from ..vocab.intervals import merge_arrays


def _codes(table: pa.Table, part: list[str]) -> np.ndarray:
    """One integer lane code per row from the partition columns (any types)."""
    code = np.zeros(table.num_rows, dtype=np.int64)
    for name in part:
        col = table[name]
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        enc = pc.dictionary_encode(col.combine_chunks())
        idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        code = code * (len(enc.dictionary) + 1) + idx
    return code


def merge(table: pa.Table, part: list[str]) -> pa.Table:
    """Merge the intervals [s, e) of `table` into disjoint ones per `part` lane; touching
    intervals join. Returns the part columns plus s and e, sorted by lane and s."""
    if table.num_rows == 0:
        return table.select([*part, "s", "e"])
    s = table["s"].to_numpy(zero_copy_only=False).astype(np.int64)
    e = table["e"].to_numpy(zero_copy_only=False).astype(np.int64)
    rows, out_s, out_e = merge_arrays(_codes(table, part), s, e)
    cols = {name: table[name].take(pa.array(rows)) for name in part}
    cols["s"] = pa.array(out_s)
    cols["e"] = pa.array(out_e)
    return pa.table(cols)


def _lanes(merged: pa.Table, part: list[str], windows: pa.Table) -> tuple:
    """Lane codes, interval starts and ends, window lanes, starts and ends as int64 arrays."""
    keys = merged.select(part)
    code = _codes(pa.concat_tables([keys, windows.select(part).cast(keys.schema)]), part)

    def col(t: pa.Table, name: str) -> np.ndarray:
        return t[name].to_numpy(zero_copy_only=False).astype(np.int64)

    return (code[: merged.num_rows], col(merged, "s"), col(merged, "e"),
            code[merged.num_rows :], col(windows, "ws"), col(windows, "we"))  # fmt: skip


def covered(merged: pa.Table, part: list[str], windows: pa.Table) -> np.ndarray:
    """For each window (the part columns plus ws, we), the time inside it that the disjoint
    `merged` intervals of its lane cover (vocab.intervals.covered)."""
    if windows.num_rows == 0 or merged.num_rows == 0:
        return np.zeros(windows.num_rows, dtype=np.int64)
    return vocab_intervals.covered(*_lanes(merged, part, windows))


def gaps(merged: pa.Table, part: list[str], windows: pa.Table, min_ns: int) -> pa.Table:
    """The stretches of at least `min_ns` inside each window (part columns plus ws, we) that
    the disjoint `merged` intervals of its lane leave uncovered: the window's part columns,
    ws, and each gap's start_ns and dur_ns. Windows whose lane has no interval are skipped."""
    merged = merged.filter(pc.greater(merged["e"], merged["s"]))  # instants split no gap
    if windows.num_rows == 0 or merged.num_rows == 0:
        win = start = dur = np.zeros(0, np.int64)
    else:
        lane, s, e, wlane, ws, we = _lanes(merged, part, windows)
        win, start, dur = vocab_intervals.gaps(lane, s, e, wlane, ws, we, min_ns)
    out = {p: windows[p].take(pa.array(win, pa.int64())) for p in part}
    out["ws"] = windows["ws"].take(pa.array(win, pa.int64())).cast(pa.int64())
    out["start_ns"] = pa.array(start, pa.int64())
    out["dur_ns"] = pa.array(dur, pa.int64())
    return pa.table(out)


def length_by_rank(merged: pa.Table) -> dict[int, int]:
    """rank -> the summed length of its disjoint (rank, s, e) intervals."""
    out: dict[int, int] = {}
    cols = (merged.column(c).to_pylist() for c in ("rank", "s", "e"))
    for rank, s, e in zip(*cols, strict=True):
        out[int(rank)] = out.get(int(rank), 0) + int(e) - int(s)
    return out

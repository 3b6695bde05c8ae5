"""Long text columns (args, shapes, dtypes) read for the few events that need them: DuckDB
filters the Parquet scan on the cheap columns first and decodes the long strings of the
matching rows only, where pyarrow decodes every row's (on a 3.9M-event CUDA trace whose 13k
collectives need their args: 2.3 s -> 0.3 s CPU)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..model.profile import Profile


def sparse_columns(
    profile: Profile, names: tuple[str, ...], keep: np.ndarray, where: str, params: list
) -> dict[str, pa.Array] | None:
    """The string columns `names` of the events table, NULL except on the rows where `keep`
    is true, which the SQL `where` (over the table's columns, with `params`) selects; None
    when the scan does not select exactly those rows (the caller then reads whole columns)."""
    import duckdb

    files = list(profile.dataset("events").files)  # the order pyarrow concatenates them in
    offsets = np.cumsum([0] + [pq.ParquetFile(f).metadata.num_rows for f in files])
    con = duckdb.connect()
    try:
        con.execute("SET threads = 1")  # the other core serves requests (web/service.py)
        con.execute("SET enable_progress_bar = false")  # never print into a server's log
        sql = f"""SELECT filename AS f, file_row_number AS i, {", ".join(names)}
            FROM read_parquet(?, filename = true, file_row_number = true) WHERE {where}"""
        got = con.sql(sql, params=[files, *params]).to_arrow_table()
    finally:
        con.close()
    index = {f: k for k, f in enumerate(files)}
    file_no = np.array([index.get(f, -1) for f in got["f"].to_pylist()], dtype=np.int64)
    if (file_no < 0).any():
        return None
    rows = offsets[file_no] + got["i"].to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.argsort(rows, kind="stable")
    if not np.array_equal(rows[order], np.flatnonzero(keep)):
        return None
    mask = pa.array(keep)
    out = {}
    for name in names:
        values = got[name].combine_chunks().take(pa.array(order)).cast(pa.string())
        out[name] = pc.replace_with_mask(pa.nulls(len(keep), pa.string()), mask, values)
    return out

"""Hostile profiles for issue 29's "stays up" half, generated (no binaries committed): each
function copies a real profile and breaks it the way a profile nobody here wrote could.

Sizes are arguments. The tests use small ones that still fail without the bounds (a few thousand
row groups, a few MB of string); `python tests/hostile_sizes.py OUT --full` writes the sizes of
the issue (11,433 one-row event groups, 200,000 one-row counter groups, a 30 MB manifest
string, a 20 MB op name), to try against a server by hand:

    python tests/hostile_sizes.py /tmp/hostile --full && neuron-explorer serve /tmp/hostile
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def base_profile(dst: Path, events: int = 2_000) -> Path:
    """A neuron-shaped profile of known structure (benchmarks/web_synth.py), with counters."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("web_synth", ROOT / "benchmarks" / "web_synth.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.make_profile(dst, events)


def _rewrite(file: Path, table: pa.Table, row_group_rows: int) -> None:
    """Write `table` over `file` with the file's own schema metadata, `row_group_rows` a group."""
    meta = pq.read_metadata(file).metadata
    pq.write_table(table.replace_schema_metadata(meta), file, row_group_size=row_group_rows)


def fragmented_events(src: Path, dst: Path, groups: int) -> Path:
    """Events written one row per row group, `groups` of them (the issue: 11,433 groups took the
    summary 50 s and the server to 3.3 GB; the same rows in one group, 0.07 s)."""
    shutil.copytree(src, dst)
    t = pq.read_table(dst / "events.parquet")
    while t.num_rows < groups:
        t = pa.concat_tables([t, t])
    _rewrite(dst / "events.parquet", t.slice(0, groups), 1)
    _set_manifest(dst, lambda m: m["row_counts"].update(events=groups))
    return dst


def fragmented_counters(src: Path, dst: Path, groups: int) -> Path:
    """`groups` one-row row groups in counters (the issue: 200,000 took the memory page to
    7.9 GB, and under a 6 GB limit the process aborted with std::bad_alloc)."""
    shutil.copytree(src, dst)
    t = pq.read_table(dst / "counters.parquet")
    while t.num_rows < groups:
        t = pa.concat_tables([t, t])
    _rewrite(dst / "counters.parquet", t.slice(0, groups), 1)
    _set_manifest(dst, lambda m: m["row_counts"].update(counters=groups))
    return dst


def deep_manifest(src: Path, dst: Path, depth: int) -> Path:
    """A manifest holding a JSON array nested `depth` deep (the issue: 200,000 gave every route
    of the profile a 500, RecursionError)."""
    shutil.copytree(src, dst)
    text = (dst / "manifest.json").read_text()
    deep = "[" * depth + "]" * depth
    (dst / "manifest.json").write_text(text.rstrip()[:-1] + f', "extra": {{"deep": {deep}}}}}')
    return dst


def infinite_step(src: Path, dst: Path) -> Path:
    """A manifest step whose `dur_ns` is `Infinity` (Python's json writes and reads it)."""
    shutil.copytree(src, dst)
    _set_manifest(dst, lambda m: m["steps"][0].update(dur_ns=float("inf")))
    return dst


def step_beyond_int64(src: Path, dst: Path) -> Path:
    """A manifest step whose `dur_ns` is an integer past int64 (10**30 ns)."""
    shutil.copytree(src, dst)
    _set_manifest(dst, lambda m: m["steps"][0].update(dur_ns=10**30))
    return dst


def corrupt_pages(src: Path, dst: Path) -> Path:
    """The data pages of `start_ns` and `dur_ns` scrambled behind an intact footer: the profile
    opens, and every read of those columns fails."""
    shutil.copytree(src, dst)
    f = dst / "events.parquet"
    data, meta = bytearray(f.read_bytes()), pq.read_metadata(f)
    for g in range(meta.num_row_groups):
        for i in range(meta.num_columns):
            col = meta.row_group(g).column(i)
            if col.path_in_schema in ("start_ns", "dur_ns"):
                first = col.data_page_offset + 30  # past the page header
                for k in range(first, col.data_page_offset + col.total_compressed_size - 8, 7):
                    data[k] ^= 0x5A
    f.write_bytes(bytes(data))
    return dst


def far_start(src: Path, dst: Path) -> Path:
    """Every event but the first moved to start at 9e18 ns, so the profile spans 9e18 ns (the
    issue: the summary gave 500, "intervals span too wide to measure in int64")."""
    shutil.copytree(src, dst)
    f = dst / "events.parquet"
    t = pq.read_table(f)
    i = t.schema.get_field_index("start_ns")
    start = t.column(i).to_pylist()
    moved = [start[0]] + [9 * 10**18 + s - start[1] for s in start[1:]]
    _rewrite(f, t.set_column(i, "start_ns", pa.array(moved, pa.int64())), 64 * 1024)
    _set_manifest(dst, lambda m: m.update(steps=[]))
    return dst


def huge_manifest_string(src: Path, dst: Path, chars: int) -> Path:
    """A manifest whose `host` is `chars` characters long (the issue: 30 MB, echoed whole)."""
    shutil.copytree(src, dst)
    _set_manifest(dst, lambda m: m.update(host="h" * chars))
    return dst


def huge_op_name(src: Path, dst: Path, chars: int) -> Path:
    """The name of every op event `chars` characters long (the issue: a 20 MB name made a
    27 MB timeline answer)."""
    shutil.copytree(src, dst)
    f = dst / "events.parquet"
    t = pq.read_table(f)
    i = t.schema.get_field_index("name")
    long_name = "aten::" + "x" * chars
    names = [long_name if n == "aten::relu" else n for n in t.column(i).to_pylist()]
    typ = t.schema.field(i).type
    _rewrite(f, t.set_column(i, "name", pa.array(names).cast(typ)), 64 * 1024)
    return dst


def _set_manifest(dst: Path, change: Callable[[dict], object]) -> None:
    m = json.loads((dst / "manifest.json").read_text())
    change(m)
    (dst / "manifest.json").write_text(json.dumps(m))


SMALL = {  # what the default test suite serves: each still fails without its bound
    "fragmented_events": lambda s, d: fragmented_events(s, d, 3_000),
    "fragmented_counters": lambda s, d: fragmented_counters(s, d, 3_000),
    "deep_manifest": lambda s, d: deep_manifest(s, d, 200_000),
    "infinite_step": infinite_step,
    "step_beyond_int64": step_beyond_int64,
    "far_start": far_start,
    "corrupt_pages": corrupt_pages,
    "huge_manifest_string": lambda s, d: huge_manifest_string(s, d, 2_000_000),
    "huge_op_name": lambda s, d: huge_op_name(s, d, 1_000_000),
    "long_op_name": lambda s, d: huge_op_name(s, d, 12_000),  # clipped in answers, not refused
}
FULL = {  # the sizes
    **SMALL,
    "fragmented_events": lambda s, d: fragmented_events(s, d, 11_433),
    "fragmented_counters": lambda s, d: fragmented_counters(s, d, 200_000),
    "huge_manifest_string": lambda s, d: huge_manifest_string(s, d, 30_000_000),
    "huge_op_name": lambda s, d: huge_op_name(s, d, 20_000_000),
}


def write_all(out: Path, full: bool = False) -> dict[str, Path]:
    """`out/good` (the intact profile) and one hostile copy of it per attack."""
    out.mkdir(parents=True, exist_ok=True)
    good = base_profile(out / "good")
    return {
        "good": good,
        **{n: make(good, out / n) for n, make in (FULL if full else SMALL).items()},
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--full", action="store_true", help="the sizes of the issue (slow to serve)")
    args = ap.parse_args()
    for name, path in write_all(args.out, args.full).items():
        print(f"{name}: {path}", file=sys.stderr)

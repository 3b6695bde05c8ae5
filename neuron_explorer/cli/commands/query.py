"""`neuron-explorer query PROFILE "SQL"`: read-only SQL over the profile's tables."""

from __future__ import annotations

import argparse

NAME = "query"
# the query runs in a watched child process (analysis/sql_process.py, as the web's SQL does):
# DuckDB's own limit misses values it builds outside its buffers (`repeat('x', 600000000)`), so
# the child is killed past MB of resident memory; DuckDB gets 3/4 of it (the web's 768 of 1024),
# 1920 MB by default, about the 2 GB the CLI gave DuckDB when it ran queries in-process
MEMORY_MB = 2560
HELP = (
    "Run read-only SQL (DuckDB) over a profile's tables: events, stacks, counters, graphs "
    "(see `neuron-explorer schema` and docs/agents.md)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("profile", help="profile directory")
    parser.add_argument("sql", help="one SELECT statement")
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="print CSV")
    fmt.add_argument("--json", action="store_true", help="print JSON (columns, rows, truncated)")
    parser.add_argument("--limit", type=int, default=1000, help="most rows to return (1000)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before stopping (30)")
    parser.add_argument("--memory", type=int, default=MEMORY_MB, metavar="MB",
                        help=f"most memory the query's process may hold ({MEMORY_MB} MB)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from ...analysis.sql_process import QueryProcess
    from ...errors import ExplorerError
    from ...model.profile import Profile

    if args.limit < 1:
        raise ExplorerError("query: --limit must be at least 1")
    if args.memory < 256:
        raise ExplorerError("query: --memory must be at least 256 (MB)")
    profile = Profile.open(args.profile)  # a bad path is named here, before any child starts
    worker = QueryProcess()
    try:
        result = worker.run(profile, args.sql, rss_limit=args.memory << 20, limit=args.limit,
                            timeout_s=args.timeout, memory_limit=f"{args.memory * 3 // 4}MB")  # fmt: skip
    finally:
        worker.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    elif args.csv:
        sys.stdout.write(result.to_csv())
    else:
        render_table(result)
    if result.truncated:
        print(f"(stopped at --limit {args.limit} rows)", file=sys.stderr)
    return 0


def render_table(result) -> None:  # analysis.QueryResult
    from decimal import Decimal

    from rich.console import Console
    from rich.markup import escape

    from ..tables import fit_table

    names = result.table.column_names
    values = [list(row.values()) for row in result.table.to_pylist()]
    numeric = {i for i in range(len(names)) if all(isinstance(r[i], int | float | Decimal | type(None))
                                                   for r in values)}  # fmt: skip
    rows = [["" if v is None else escape(str(v)) for v in r] for r in values]
    console = Console()
    text = [i for i in range(len(names)) if i not in numeric]
    console.print(fit_table(console.width, names, rows, text=text, right=numeric,
                            caption=f"{len(rows)} rows"))  # fmt: skip

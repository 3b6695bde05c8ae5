"""`neuron-explorer schema`: every table and column of the profile format."""

from __future__ import annotations

import argparse

NAME = "schema"
HELP = "Print every table and column of the profile format with its type, unit and meaning."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print as JSON")


def run(args: argparse.Namespace) -> int:
    import json

    from ...model.schema import OPTIONAL_TABLES, SCHEMA_VERSION, TABLES

    if args.json:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "tables": {
                t.name: {
                    "doc": t.doc,
                    "optional": t.name in OPTIONAL_TABLES,
                    "columns": [
                        {"name": c.name, "type": str(c.type), "unit": c.unit, "doc": c.doc}
                        for c in t.columns
                    ],
                }
                for t in (*TABLES.values(), *OPTIONAL_TABLES.values())
            },
        }
        print(json.dumps(doc, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console()
    console.print(f"[bold]neuron-explorer profile format, schema version {SCHEMA_VERSION}[/]")
    for t in (*TABLES.values(), *OPTIONAL_TABLES.values()):
        optional = " (optional)" if t.name in OPTIONAL_TABLES else ""
        rt = RichTable(title=f"{t.name}{optional}  ({t.doc})", title_justify="left", expand=False)
        for h in ("column", "type", "unit", "meaning"):
            rt.add_column(h, overflow="fold")
        for c in t.columns:
            ty = "string (dictionary)" if str(c.type).startswith("dictionary") else str(c.type)
            rt.add_row(c.name, ty, c.unit, c.doc)
        console.print(rt)
    return 0

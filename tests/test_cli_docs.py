"""Docs that tests keep honest: docs/cli.md has a section for exactly the commands in COMMANDS,
naming each option; docs/format.md names every manifest field and every column of every table,
and its DuckDB and pyarrow examples run."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from neuron_explorer.entry import COMMANDS, build_parser
from neuron_explorer.model import Manifest, ProfileWriter
from neuron_explorer.model.schema import OPTIONAL_TABLES, TABLES

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _sections(path: Path, level: str) -> dict[str, str]:
    """Heading text -> body, for headings of exactly `level` (e.g. "##")."""
    text = path.read_text(encoding="utf-8")
    parts = re.split(rf"^{level} (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _command_sections() -> dict[str, str]:
    out = {}
    for heading, body in _sections(DOCS / "cli.md", "##").items():
        m = re.fullmatch(r"`neuron-explorer (\S+)`", heading)
        if m:
            out[m.group(1)] = body
    return out


def test_cli_md_documents_exactly_the_commands():
    documented = set(_command_sections())
    assert documented - set(COMMANDS) == set(), "docs/cli.md documents commands that do not exist"
    assert set(COMMANDS) - documented == set(), "commands missing from docs/cli.md"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_cli_md_names_every_option(name):
    body = _command_sections().get(name, "")
    (sub,) = (a for a in build_parser()._actions if a.dest == "command")
    for action in sub.choices[name]._actions:
        for opt in action.option_strings:
            if opt in ("-h", "--help"):
                continue
            assert f"`{opt}" in body, f"docs/cli.md: {name} does not document {opt}"


def test_format_md_names_every_column_of_every_table():
    tables = {h.strip("`"): body for h, body in _sections(DOCS / "format.md", "###").items()}
    for table in (*TABLES.values(), *OPTIONAL_TABLES.values()):
        assert table.name in tables, f"docs/format.md has no section for table {table.name}"
        for col in table.columns:
            assert f"`{col.name}`" in tables[table.name], (
                f"docs/format.md: {table.name}.{col.name} is not described"
            )


def test_format_md_names_every_manifest_field():
    body = _sections(DOCS / "format.md", "##")["manifest.json"]
    for f in dataclasses.fields(Manifest):
        assert f"`{f.name}`" in body, f"docs/format.md: manifest field {f.name} is not described"


def _code_blocks(lang: str) -> list[str]:
    text = (DOCS / "format.md").read_text(encoding="utf-8")
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("ranks", [(0,), (0, 1)], ids=["one-rank", "two-ranks"])
def test_format_md_reading_examples_run(tmp_path, monkeypatch, ranks):
    """The DuckDB and pyarrow snippets in format.md work on both layouts (file and rank dirs)."""
    import duckdb

    n = 64
    with ProfileWriter(tmp_path / "run1") as w:
        w.write_events(
            {
                "id": list(range(n)),
                "rank": [ranks[i % len(ranks)] for i in range(n)],
                "layer": ["device" if i % 2 else "host" for i in range(n)],
                "kind": ["gpu_kernel" if i % 2 else "op" for i in range(n)],
                "name": [f"k{i % 4}" for i in range(n)],
                "track": ["stream 7" if i % 2 else "thread 1" for i in range(n)],
                "start_ns": [i * 50_000 for i in range(n)],
                "dur_ns": [1000] * n,
                "op_name": ["aten::mm"] * n,
            }
        )
        w.commit(Manifest(source="kineto", origin_unix_ns=0, ranks=ranks))
    monkeypatch.chdir(tmp_path)
    (sql,) = _code_blocks("sql")
    statements = [s for s in sql.split(";") if s.strip()]
    if len(ranks) == 1:
        top = duckdb.sql(statements[0]).fetchall()
        assert sum(row[1] for row in top) == n // 2
    else:
        walls = duckdb.sql(statements[1]).fetchall()
        assert sorted(r for r, _ in walls) == list(ranks)
    for block in _code_blocks("python"):
        if "spark" in block:
            continue  # Spark is not installed here
        if len(ranks) > 1:
            block = block.replace('"run1/events.parquet"', '"run1/events"')
        if importlib.util.find_spec("pandas") is None:
            block = block.replace("window.to_pandas()", "window")  # pandas is not a dependency
        scope: dict = {}
        exec(compile(block, "docs/format.md", "exec"), scope)  # our own docs
        if "window" in scope:
            assert scope["window"].num_rows == 20  # starts 1.00 ms .. 1.95 ms, 50 us apart
        if "kernels" in scope:
            assert scope["kernels"].num_rows == n // 2

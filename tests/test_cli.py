"""The command line as a whole: --version, --help on every command in COMMANDS, the schema
command's output, and the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_explorer import __version__
from neuron_explorer.entry import COMMANDS, build_parser, main
from neuron_explorer.model.schema import OPTIONAL_TABLES, SCHEMA_VERSION, TABLES


def _subparsers():
    parser = build_parser()
    (sub,) = (a for a in parser._actions if a.dest == "command")
    return sub.choices


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"neuron-explorer {__version__}"


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_naming_its_options(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: neuron-explorer {name}")
    for action in _subparsers()[name]._actions:
        if action.option_strings:
            for opt in action.option_strings:
                assert opt in out, f"{name} --help does not mention {opt}"
            assert action.help, f"{name} {action.option_strings[0]} has no help text"
        else:
            shown = action.metavar or action.dest
            assert shown in out, f"{name} --help does not mention {shown}"


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["no-such-command"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_schema_prints_every_column(capsys):
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert f"schema version {SCHEMA_VERSION}" in out
    for table in (*TABLES.values(), *OPTIONAL_TABLES.values()):
        assert table.name in out
        for col in table.columns:
            assert col.name in out, f"schema does not print {table.name}.{col.name}"


def test_schema_json_matches_the_schema_module(capsys):
    assert main(["schema", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert set(doc["tables"]) == set(TABLES) | set(OPTIONAL_TABLES)
    for name, table in {**TABLES, **OPTIONAL_TABLES}.items():
        assert doc["tables"][name]["optional"] == (name in OPTIONAL_TABLES)
        got = doc["tables"][name]["columns"]
        assert [c["name"] for c in got] == [c.name for c in table.columns]
        assert [c["unit"] for c in got] == [c.unit for c in table.columns]
        assert all(c["doc"] and c["type"] for c in got)


def test_installed_console_script(tmp_path):
    """The `neuron-explorer` script that pip installed runs, with its one-line error rule."""
    script = Path(sys.prefix) / "bin" / "neuron-explorer"
    assert script.is_file(), f"{script} missing: run `make venv`"
    done = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"neuron-explorer {__version__}"
    missing = tmp_path / "no-such-profile"
    done = subprocess.run(
        [script, "export", str(missing)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"neuron-explorer: error: {missing}: not a profile directory (no such directory)"
    ]

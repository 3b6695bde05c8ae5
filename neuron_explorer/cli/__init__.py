"""The `neuron-explorer` command line. One table lists every command; each command is a small
module with NAME, HELP, add_arguments(parser) and run(args) -> int. This package knows only its
own commands (neuron_explorer/cli/commands); the top, neuron_explorer.entry, adds web's `serve`
and agents' `mcp` and `report` to them, since the CLI never imports web or agents."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence

from .. import __version__
from ..errors import ExplorerError

# command name -> its module: a name under neuron_explorer.cli.commands, or a dotted path
# (imported only when the parser is built)
COMMANDS: dict[str, str] = {
    "schema": "schema",
    "import": "import_trace",
    "summary": "summary",
    "modules": "modules",
    "lines": "lines",
    "operators": "operators",
    "analyze": "analyze",
    "diff": "diff",
    "critical-path": "critical_path",
    "whatif": "whatif",
    "query": "query",
    "capture": "capture",
    "export": "export",
}


def _load(module: str):  # a command module
    return importlib.import_module(module if "." in module else f"{__name__}.commands.{module}")


def build_parser(commands: Mapping[str, str] = COMMANDS) -> argparse.ArgumentParser:
    """The parser of `commands` (name -> module), each command's module imported to read it."""
    parser = argparse.ArgumentParser(
        prog="neuron-explorer",
        description="Profiler and trace explorer for PyTorch on the (modeled) neuron device.",
    )
    parser.add_argument("--version", action="version", version=f"neuron-explorer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, path in commands.items():
        module = _load(path)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None, commands: Mapping[str, str] = COMMANDS) -> int:
    """Run one command of `commands`; an ExplorerError is one line on stderr and status 2."""
    parser = build_parser(commands)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except ExplorerError as e:
        print(f"neuron-explorer: error: {e}", file=sys.stderr)
        return 2
    except OverflowError as e:  # times too wide for int64 (a damaged or hostile profile)
        where = getattr(args, "profile", None) or getattr(args, "path", None) or "input"
        print(f"neuron-explorer: error: {where}: cannot be analysed ({e})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("neuron-explorer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

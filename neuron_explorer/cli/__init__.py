"""The `neuron-explorer` command line. One table lists every command; each command is a small
module in explorer/cli/commands with NAME, HELP, add_arguments(parser) and run(args) -> int."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import ExplorerError

# command name -> module under neuron_explorer.cli.commands (imported only when needed)
COMMANDS: dict[str, str] = {
    "schema": "schema",
    "import": "import_trace",
    "summary": "summary",
    "modules": "modules",
    "lines": "lines",
    "analyze": "analyze",
    "query": "query",
    "capture": "capture",
    "export": "export",
    "serve": "serve",
    "mcp": "mcp",
    "report": "report",
}


def _load(name: str):  # a command module
    return importlib.import_module(f"neuron_explorer.cli.commands.{COMMANDS[name]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-explorer",
        description="Profiler and trace explorer for PyTorch on the (modeled) neuron device.",
    )
    parser.add_argument("--version", action="version", version=f"neuron-explorer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = _load(name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except ExplorerError as e:
        print(f"neuron-explorer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("neuron-explorer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

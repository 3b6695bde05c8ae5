"""The top of the package: the `neuron-explorer` command, assembled from the CLI's commands and
those of the layers above it (web's `serve`, agents' `mcp` and `report`). The console script and
`python -m neuron_explorer` both run `main`; building the parser imports no heavy library."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from neuron_explorer import cli

# every command, in the order `--help` lists them: name -> module (cli.COMMANDS first)
COMMANDS: dict[str, str] = {
    **cli.COMMANDS,
    "serve": "neuron_explorer.web.commands.serve",
    "mcp": "neuron_explorer.agents.commands.mcp",
    "report": "neuron_explorer.agents.commands.report",
}


def build_parser():  # argparse.ArgumentParser of every command
    return cli.build_parser(COMMANDS)


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(argv, COMMANDS)


if __name__ == "__main__":
    sys.exit(main())

"""`neuron-explorer mcp [PATH]`: a Model Context Protocol server over stdio for coding agents."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "mcp"
HELP = (
    "Serve the profiles under PATH to a coding agent as a Model Context Protocol server over "
    "stdio: tools for the profile list, summary, findings, SQL, timeline windows, events, "
    "source lines, hotspots, operators, compare and the report (docs/agents.md)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", default=".",
                        help="a profile, a directory of profiles, or a .json(.gz) trace (default .)")  # fmt: skip
    parser.add_argument("--source-root", action="append", type=Path, default=[], metavar="DIR",
                        help="for a raw trace: where else to look for the source files its stacks "
                        "name (repeatable; the trace's own directory is always searched)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ...errors import ExplorerError

    try:
        import mcp.server  # noqa: F401 - the SDK, an optional dependency

        from ...agents.server import serve_stdio
    except ImportError as e:
        raise ExplorerError(
            f"mcp: the MCP SDK is not installed ({e}); pip install mcp==2.3.0"
        ) from None
    return serve_stdio(args.path, args.source_root)

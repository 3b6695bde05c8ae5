"""`neuron-explorer serve PATH`: the web UI for a profile, a folder of profiles or a raw trace."""

from __future__ import annotations

import argparse

NAME = "serve"
HELP = (
    "Serve the web UI (timeline, operators, source, findings, SQL, compare) for a profile, "
    "a directory of profiles, or a raw torch.profiler trace, on 127.0.0.1."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a profile, a directory of profiles, or a .json(.gz) trace")
    parser.add_argument("--host", default="127.0.0.1",
                        help="interface to bind (default 127.0.0.1; others are reachable from the network)")  # fmt: skip
    parser.add_argument(
        "--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)"
    )
    parser.add_argument("--open", action="store_true", help="open the UI in a web browser")


def run(args: argparse.Namespace) -> int:
    from neuron_explorer.web import serve

    return serve(args.path, host=args.host, port=args.port, open_browser=args.open)

"""`neuron-explorer serve PATH`: the web UI for a profile, a folder of profiles or a raw trace."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from neuron_explorer.errors import ExplorerError

from .. import resolve_root

LOOPBACK = ("127.0.0.1", "localhost", "::1")
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
    parser.add_argument("--source-root", action="append", type=Path, default=[], metavar="DIR",
                        help="for a raw trace: where else to look for the source files its stacks "
                        "name (repeatable; the trace's own directory is always searched)")  # fmt: skip
    parser.add_argument("--max-memory", metavar="SIZE",
                        help="the server's memory ceiling, e.g. 4G or 800M (default: half the "
                             "machine's memory); work that would pass it is refused with 503")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ..memory import parse_size

    max_memory = parse_size(args.max_memory) if args.max_memory else None
    return serve(args.path, host=args.host, port=args.port, open_browser=args.open,
                 source_roots=args.source_root, max_memory=max_memory)  # fmt: skip


def serve(
    path: str | Path,
    host: str = "127.0.0.1",
    port: int = 8765,
    open_browser: bool = False,
    source_roots: list[Path] | None = None,
    max_memory: int | None = None,
) -> int:
    """Serve PATH until interrupted; prints the URL and warns when not bound to loopback.
    `max_memory` is the memory ceiling in bytes (default: half the machine's)."""
    import socket
    import threading
    import webbrowser

    import uvicorn

    from ..app import create_app

    root = resolve_root(path, source_roots or ())
    loopback = host in LOOPBACK
    app = create_app(
        root,
        allowed_hosts=["127.0.0.1", "localhost", "[::1]", "::1"] if loopback else None,
        max_memory=max_memory,
    )
    app.state.service.memory.watch()
    # bind before printing the URL, so it is reachable the moment it is shown
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ExplorerError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    if len(app.state.store.names()) == 1 and root.name in app.state.store.names():
        url += f"p/{root.name}"
    if not loopback:
        print(f"neuron-explorer: warning: serving on {host}, reachable from other machines; "
              "profiles include source code and there is no authentication", file=sys.stderr)  # fmt: skip
    print(f"Neuron Explorer serving {root} at {url}  (Ctrl-C to stop)", flush=True)
    # the first visit should not wait for the analysis of a big profile
    threading.Thread(target=app.state.warm_up, daemon=True, name="warm-up").start()
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    from ..guard import IdleTimeoutProtocol

    # on SIGTERM, requests still running after a few seconds (a hung disk) are abandoned
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            http=IdleTimeoutProtocol, timeout_graceful_shutdown=3)  # fmt: skip
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    # Worker and warm-up threads may still hold DuckDB connections or be inside a query; tearing
    # the interpreter down under them aborts the process with a C++ error, so leave directly.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

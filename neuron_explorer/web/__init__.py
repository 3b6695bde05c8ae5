"""The web UI. `serve` is the one entry point the CLI uses; the app itself lives in web.app."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

from neuron_explorer.errors import ExplorerError

TRACE_SUFFIXES = (".json", ".json.gz")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cache_dir() -> Path:
    """Where raw traces are imported on the fly: $XDG_CACHE_HOME or ~/.cache, neuron-explorer/."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "neuron-explorer"


def _is_trace(path: Path) -> bool:
    return path.is_file() and path.name.endswith(TRACE_SUFFIXES)


def _profile_name(trace: Path) -> str:
    stem = trace.name
    for suffix in (".gz", ".json", ".trace", ".pt"):
        stem = stem.removesuffix(suffix)
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", stem).strip("-.") or "trace"


def import_cached(traces: list[Path]) -> Path:
    """Import raw torch.profiler traces into a cache folder keyed by their paths, sizes and
    mtimes (reused while they are unchanged); returns the folder of profiles."""
    from neuron_explorer.importers import import_traces
    from neuron_explorer.model.profile import is_profile

    key = hashlib.sha1()
    for t in traces:
        st = t.stat()
        key.update(f"{t.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    out_dir = cache_dir() / key.hexdigest()[:16]
    for t in traces:
        out = out_dir / _profile_name(t)
        if not is_profile(out):
            print(f"importing {t} into {out}", file=sys.stderr)
            import_traces([t], out)
    return out_dir


def resolve_root(path: str | Path) -> Path:
    """What to serve for PATH: a profile, a folder of profiles, or raw traces imported first."""
    from neuron_explorer.model.profile import is_profile

    p = Path(path).expanduser()
    if not p.exists():
        raise ExplorerError(f"{p}: no such file or directory")
    if _is_trace(p):
        return import_cached([p]) / _profile_name(p)
    if p.is_dir() and not is_profile(p):
        has_profiles = any(is_profile(c) for c in p.iterdir() if c.is_dir())
        traces = sorted(c for c in p.iterdir() if _is_trace(c))
        if not has_profiles and traces:
            return import_cached(traces)
        if not has_profiles:
            raise ExplorerError(f"{p}: no profiles or torch.profiler traces in this directory")
    elif not p.is_dir():
        raise ExplorerError(f"{p}: not a profile, a directory of profiles or a .json(.gz) trace")
    return p


def serve(
    path: str | Path, host: str = "127.0.0.1", port: int = 8765, open_browser: bool = False
) -> int:
    """Serve PATH until interrupted; prints the URL and warns when not bound to loopback."""
    import socket
    import threading
    import webbrowser

    import uvicorn

    from .app import create_app

    root = resolve_root(path)
    loopback = host in LOOPBACK
    app = create_app(
        root, allowed_hosts=["127.0.0.1", "localhost", "[::1]", "::1"] if loopback else None
    )
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
    from .guard import IdleTimeoutProtocol

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

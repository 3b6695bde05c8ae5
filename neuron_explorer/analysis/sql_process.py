"""Read-only SQL in a worker process whose memory and time are bounded from outside.

DuckDB keeps its own buffers under `memory_limit`, but not every value it builds: one
`SELECT repeat('x', 600000000)` makes a 1.2 GB string outside the limit, and its interrupt lands
only once the row is built. So the web server runs user SQL in a child process
(`python -m neuron_explorer.analysis.sql_process`, one per SQL thread, started on first use and
kept): the parent watches the child's resident memory while a query runs and kills it past
`rss_limit`, or past its time limit plus a grace, then answers one line and starts a fresh
child for the next query. Inside the child the query runs through `sql.run_query` as before
(read-only connection, row, byte and time limits), and its rows come back as Arrow IPC.
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

import pyarrow as pa

from ..errors import ExplorerError
from ..model.profile import Profile
from .sql import QueryResult

POLL_S = 0.01  # how often the parent reads the child's resident memory
GRACE_S = 2.0  # past the time limit, the child's own interrupt gets this long to land
# an idle child ends after this long (a server's many SQL threads, or many test apps, do not
# keep a process each for ever); the parent replaces one idle nearly as long before using it
IDLE_S = 300.0
IDLE_MARGIN_S = 10.0
PAGE = os.sysconf("SC_PAGE_SIZE")
_HEADER = struct.Struct("<Q")


def _send(f: IO[bytes], data: bytes) -> None:
    f.write(_HEADER.pack(len(data)) + data)
    f.flush()


def _recv(f: IO[bytes]) -> bytes:
    head = f.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError
    (n,) = _HEADER.unpack(head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data


class QueryProcess:
    """One child process that runs queries one at a time (not thread-safe: one per thread)."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._last = 0.0  # when the child last answered

    def _child(self) -> subprocess.Popen[bytes]:
        idle = time.monotonic() - self._last
        if self._proc is not None and idle > self.idle_s - min(IDLE_MARGIN_S, self.idle_s / 2):
            self.close()  # it is about to end on its own: never send it a query
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.idle_s)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": _import_path()},
            )
            self._last = time.monotonic()
        return self._proc

    def run(self, profile: Profile, sql: str, *, rss_limit: int, **limits: Any) -> QueryResult:
        """sql.run_query(profile, sql, **limits) in the child; ExplorerError when it fails, or
        when the child passes `rss_limit` bytes of resident memory or its time limit."""
        proc = self._child()
        assert proc.stdin is not None and proc.stdout is not None
        request = {"path": str(profile.path.resolve()), "sql": sql, **limits}
        try:
            _send(proc.stdin, json.dumps(request).encode())
        except OSError:
            self.close()
            raise ExplorerError("query: the query process could not be started") from None
        timeout_s = float(limits.get("timeout_s", 30.0))
        why = self._watch(proc, rss_limit, timeout_s)
        if why is not None:
            self.close()
            raise ExplorerError(why)
        try:
            head = json.loads(_recv(proc.stdout))
            body = _recv(proc.stdout)
        except (EOFError, OSError, ValueError):
            self.close()
            raise ExplorerError("query: the query process ended before answering") from None
        self._last = time.monotonic()
        if "error" in head:
            raise ExplorerError(head["error"])
        with pa.ipc.open_stream(pa.BufferReader(body)) as reader:
            table = reader.read_all()
        return QueryResult(table, head["truncated"], head["elapsed_s"], head["cut_at_bytes"])

    def _watch(self, proc: subprocess.Popen[bytes], rss_limit: int, timeout_s: float) -> str | None:
        """Wait for the child's answer; why it was stopped instead, or None."""
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout_s + GRACE_S
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], POLL_S)
            if ready:
                return None
            if _rss(proc.pid) > rss_limit:
                return (f"query: stopped: it needed more than {rss_limit >> 20} MB of memory "
                        "(the limit of one query)")  # fmt: skip
            if time.monotonic() > deadline:
                return f"query: stopped after the time limit of {timeout_s:g} s"

    def close(self) -> None:
        """Kill the child (a fresh one starts with the next query)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc is not None:
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    f.close()


def _import_path() -> str:
    """PYTHONPATH for the child: this package's folder first, so the child imports the same
    neuron_explorer as the server even when the server found it through sys.path alone."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rest = os.environ.get("PYTHONPATH")
    return here + (os.pathsep + rest if rest else "")


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0  # gone: the read of its answer says so


# ---- the child ---------------------------------------------------------------------------


def _answer(
    request: dict[str, Any], profiles: dict[str, tuple[float, Profile]]
) -> tuple[bytes, bytes]:
    from .sql import run_query

    path = request.pop("path")
    mtime = os.stat(os.path.join(path, "manifest.json")).st_mtime
    hit = profiles.get(path)
    if hit is None or hit[0] != mtime:
        profiles[path] = hit = (mtime, Profile.open(path))
    res = run_query(hit[1], request.pop("sql"), **request)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, res.table.schema) as writer:
        writer.write_table(res.table)
    head = {"truncated": res.truncated, "elapsed_s": res.elapsed_s,
            "cut_at_bytes": res.cut_at_bytes}  # fmt: skip
    return json.dumps(head).encode(), sink.getvalue().to_pybytes()


def _orphan_watch(parent: int) -> None:
    """End the child when the server that started it is gone, even mid-query."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def main(idle_s: float = IDLE_S) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server's Ctrl-C is the server's
    threading.Thread(target=_orphan_watch, args=(os.getppid(),), daemon=True).start()
    # the answers get the pipe to themselves: anything a library prints goes to stderr
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    profiles: dict[str, tuple[float, Profile]] = {}
    while True:
        if not select.select([stdin], [], [], idle_s)[0]:
            return  # idle: the parent starts a fresh child when it needs one
        try:
            request = json.loads(_recv(stdin))
        except EOFError:
            return
        try:
            head, body = _answer(request, profiles)
        except ExplorerError as e:
            head, body = json.dumps({"error": str(e)}).encode(), b""
        except Exception as e:  # noqa: BLE001 - one line to the user, never a traceback
            head, body = json.dumps({"error": f"query: failed ({type(e).__name__})"}).encode(), b""
        _send(stdout, head)
        _send(stdout, body)


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else IDLE_S)

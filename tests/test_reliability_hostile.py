"""Issue 29, the server stays up: the hostile profiles of tests/hostile_sizes.py (row groups as a
weapon, a manifest nested 200,000 deep, steps of Infinity and past int64, events at 9e18 ns,
megabyte strings in the manifest and in op names, data pages scrambled behind a sound footer) against `neuron-explorer serve` (real uvicorn on 127.0.0.1, a free port).
Each bad profile is one 4xx naming the file and the problem, never a 500; every answer goes
out on the same kept-alive connection as the next; strings are clipped; and the server's peak
memory (VmHWM, a counted quantity) stays bounded, under `--max-memory` too."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hostile_sizes
import pytest

from neuron_explorer.model import bounds
from neuron_explorer.web.responses import MAX_STRING_CHARS

ROOT = Path(__file__).resolve().parents[1]
ROUTES = ("", "/timeline", "/memory", "/operators", "/modules", "/calltree", "/source",
          "/findings", "/ranks", "/search?q=aten", "/counters?start_ns=0&end_ns=1000000")  # fmt: skip
# each profile refused (when opened; huge_op_name before its names are first read): the words
# its error holds (after its file's path)
REFUSED = {
    "fragmented_events": ("events.parquet", "3,000 row groups for 3,000 rows"),
    "fragmented_counters": ("counters.parquet", "3,000 row groups for 3,000 rows"),
    "deep_manifest": ("manifest.json", f"nested deeper than {bounds.MAX_JSON_DEPTH}"),
    "infinite_step": ("manifest.json", "Infinity is not a number JSON allows"),
    "step_beyond_int64": ("manifest.json", "does not fit in 64 bits"),
    "huge_op_name": ("events.parquet", "a name of 1,000,006 bytes, longer than the 16,384"),
    "corrupt_pages": ("", "corrupt Parquet table"),
}
# refused when their tables are read, not when opened: the page shells and a one-rank
# profile's ranks answer (they read no events)
READ_LATE = ("huge_op_name", "corrupt_pages")
# measured: the server holds ~200 MB serving `good` alone; before the bounds, 3,000 one-row
# groups took it to 846 MB, and a search over the 1 MB op names answered 41 MB (20 MB names:
# 2.9 GB and 20 s for the timeline)
PEAK_MB = 500
ANSWER_BYTES = 1 << 20


@contextmanager
def serve(root: Path, cwd: Path, *extra: str) -> Iterator[tuple[str, int]]:
    """`python -m neuron_explorer serve ROOT --port 0 EXTRA` in `cwd`; yields (host:port, pid)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cwd / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "serve", str(root), "--port", "0", *extra],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert " at http://" in line, line + proc.stderr.read()
        yield line.split(" at http://")[1].split("/")[0], proc.pid
        assert proc.poll() is None, proc.stderr.read()[-3000:]  # still up
    finally:
        proc.kill()
        proc.wait(timeout=30)


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


class KeptAlive:
    """One HTTP/1.1 connection, used for every request: an answer that closed it fails the next."""

    def __init__(self, hostport: str) -> None:
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=120)
        self.host = hostport
        self.buf = b""

    def get(self, path: str) -> tuple[int, bytes]:
        req = f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode()
        self.sock.sendall(req)  # a closed connection fails here or in the read below
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(x.lower().split(": ", 1) for x in lines[1:])
        assert headers.get("connection") != "close", (path, lines[0])
        length = int(headers["content-length"])
        while len(self.buf) < length:
            self._more()
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(lines[0].split()[1]), body

    def _more(self) -> None:
        chunk = self.sock.recv(1 << 20)
        assert chunk, "the server closed the connection"
        self.buf += chunk


def longest_string(doc: object) -> int:
    if isinstance(doc, str):
        return len(doc)
    if isinstance(doc, dict):
        doc = list(doc.values())
    if isinstance(doc, list):
        return max((longest_string(v) for v in doc), default=0)
    return 0


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "profiles"
    hostile_sizes.write_all(root)
    return root


@pytest.mark.sweep  # ~16 s
def test_every_hostile_profile_is_a_clear_4xx_on_one_kept_alive_connection(hostile, tmp_path):
    with serve(hostile, tmp_path) as (hostport, pid):
        c = KeptAlive(hostport)
        for name, (file, problem) in REFUSED.items():
            for route in ROUTES:
                status, body = c.get(f"/api/p/{name}{route}")
                late = name in READ_LATE and route in (
                    "/ranks",
                    "/counters?start_ns=0&end_ns=1000000",
                )
                if late and status == 200:  # no events read (one rank; the counters table)
                    continue
                error = json.loads(body)["error"]
                # named by its path in the served folder, never the server's (web/store.py)
                assert status == 422 and error.startswith((f"{name}/", f"{name}:")), (
                    name,
                    route,
                    body[:300],
                )
                assert file in error and problem in error and "\n" not in error, error
            status, body = c.get(f"/p/{name}")  # the page's shell opens the profile only
            if name not in READ_LATE:
                assert status == 422 and b"error-box" in body and problem.encode() in body
            assert c.get("/api/p/good")[0] == 200  # the same connection, after the error
        # events at 9e18 ns: the timeline fits the rest, the rules cannot measure the spans
        for route in ROUTES:
            status, body = c.get(f"/api/p/far_start{route}")
            if route in ("", "/findings"):
                assert status == 422 and "cannot be analysed" in json.loads(body)["error"]
            else:
                assert status == 200, (route, body[:300])
        # long strings: answered, each clipped with its marker, answers bounded
        for name in ("huge_manifest_string", "long_op_name"):
            for route in ROUTES:
                status, body = c.get(f"/api/p/{name}{route}")
                assert status == 200 and len(body) < ANSWER_BYTES, (name, route, len(body))
                assert longest_string(json.loads(body)) <= MAX_STRING_CHARS + 40
        status, body = c.get("/api/p/long_op_name/search?q=aten::xxx")
        assert status == 200 and b"x\xe2\x80\xa6 [2,006 more characters]" in body
        status, body = c.get("/api/p/huge_manifest_string")
        assert b"h\xe2\x80\xa6 [1,990,000 more characters]" in body  # the host, 2,000,000 long
        status, body = c.get("/api/profiles")
        rows = {r["name"]: r for r in json.loads(body)["profiles"]}
        assert all(problem in rows[n]["error"] for n, (_, problem) in REFUSED.items())
        assert rows["good"]["error"] is None and rows["long_op_name"]["error"] is None
        # the warm-up has been through every profile by now (the list waits for small ones)
        time.sleep(1.0)
        peak = peak_mb(pid)
    print(f"\nserver peak over {len(rows)} hostile and good profiles: {peak:.0f} MB")
    assert peak < PEAK_MB


@pytest.mark.sweep  # ~16 s
def test_the_memory_ceiling_refuses_a_profile_that_would_pass_it(tmp_path):
    """`--max-memory 400M`: a 530,000-event profile needs about 410 MB (rows counted in its
    footers), so its pages are refused with 503 before a row is read, but for its timeline,
    which reads it in batches (issue 31); the small profile is served on the same connection,
    and the process never holds more than the ceiling."""
    root = tmp_path / "profiles"
    hostile_sizes.base_profile(root / "good")
    hostile_sizes.base_profile(root / "big", 530_000)  # more than the ceiling on its own
    with serve(root, tmp_path, "--max-memory", "400M") as (hostport, pid):
        c = KeptAlive(hostport)
        status, body = c.get("/api/p/big/timeline")  # read in batches: ~200 MB (issue 31)
        assert status == 200, body[:300]
        for _ in range(2):
            for route in ("", "/operators", "/findings", "/calltree"):
                status, body = c.get(f"/api/p/big{route}")
                error = json.loads(body)["error"]
                assert status == 503 and "400 MB ceiling (--max-memory)" in error, (route, error)
                assert c.get(f"/api/p/good{route}")[0] == 200
        peak = peak_mb(pid)
    print(f"\nserver peak under a 400 MB ceiling: {peak:.0f} MB")
    assert peak < 400


def test_footers_are_sized_before_they_are_parsed(tmp_path, monkeypatch):
    """A footer past MAX_FOOTER_BYTES is refused from the file's last 8 bytes, unparsed (the
    issue's 200,000 counter row groups make a footer of tens of MB)."""
    from neuron_explorer.errors import BadInputError
    from neuron_explorer.model import Profile

    good = hostile_sizes.base_profile(tmp_path / "good")
    size = bounds.footer_size(good / "events.parquet")
    monkeypatch.setattr(bounds, "MAX_FOOTER_BYTES", size - 1)
    with pytest.raises(BadInputError, match=r"events\.parquet: Parquet footer of 0 MB, more than"):
        Profile.open(good)


@pytest.mark.sweep  # a server past its ceiling: ~17 s quiet (default suite < 15 min)
def test_past_the_ceiling_pages_wait_and_static_files_are_served(tmp_path, capsys):
    """A ceiling below what the server holds at start (`--max-memory 50M`): every JSON answer
    is a 503 saying so, static files and page shells are still served, and the process stays."""
    from neuron_explorer.entry import main

    root = hostile_sizes.base_profile(tmp_path / "good")
    with serve(root, tmp_path, "--max-memory", "50M") as (hostport, _):
        c = KeptAlive(hostport)
        for url in ("/api/profiles", "/api/p/good", "/api/p/good/timeline"):
            status, body = c.get(url)
            assert (
                status == 503
                and "of its 50 MB ceiling (--max-memory), past it" in json.loads(body)["error"]
            )
        assert c.get("/static/app.css")[0] == 200 and c.get("/p/good")[0] == 200
    capsys.readouterr()
    assert main(["serve", str(root), "--max-memory", "lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "neuron-explorer: error: --max-memory: 'lots' is not a size such as 4G or 512M"


def test_the_cli_on_a_profile_whose_times_overflow_is_one_line(tmp_path):
    # the server answers 422 for it; the command line says the same in one line, no traceback
    import subprocess
    import sys

    import hostile_sizes

    far = hostile_sizes.far_start(hostile_sizes.base_profile(tmp_path / "good"), tmp_path / "far")
    for command in ("summary", "analyze"):
        done = subprocess.run([sys.executable, "-m", "neuron_explorer", command, str(far)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 2, (command, done.stderr[-500:])
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert f"{far}: cannot be analysed" in done.stderr

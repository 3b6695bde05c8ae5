"""The server's memory ceiling (`serve --max-memory`): work that would take the process past it
is refused before it reads anything, with one line saying what it needed; when the process
nears it anyway, what the server keeps in memory for other profiles is let go first.

What a profile needs is known before its tables are read: their rows, from the Parquet footers
(exact: a decoder yields the rows its footer counts), at EVENT_BYTES a row, plus what the
footers say the columns hold uncompressed (`tables_bytes`, model/footprint.py: the estimate the
import sizes an excerpt by, so a server with the import's budget as its ceiling can analyse
it)."""

from __future__ import annotations

import ctypes
import gc
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from neuron_explorer.errors import ExplorerError
from neuron_explorer.model.bounds import machine_bytes
from neuron_explorer.model.footprint import EVENT_BYTES as EVENT_BYTES  # re-exported
from neuron_explorer.model.footprint import tables_bytes as tables_bytes
from neuron_explorer.model.profile import Profile

# What the analysis pages the import does not store (modules, call tree, memory, a source
# line's panel, critical path, what-if, compare's kernels and module tree) hold at their peak
# over what the server held, every one of them visited in turn: far less than the analysis the
# import stores (summary, findings: tables_bytes), which they do not compute. Measured in a
# fresh process (benchmarks/README.md, "What the analysis pages of an excerpt hold"): 249 MB
# for 1,525 events (what-if's libraries), 561 MB for 228,773, 764 MB for the 10 GB trace's
# excerpt of 1,796,720 (about 290 B an event over a fixed part); this estimate is 1.24x that.
PAGE_EVENT_BYTES = 256
PAGE_BASE_BYTES = 512 << 20

DEFAULT_SHARE = 0.5  # of the machine's memory (or of the cgroup's limit when lower)
WATCH_S = 0.1
# how long a request waits for other work's reservations (the warm-up's) to end before a 503
WAIT_S = 30.0
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class OverMemory(ExplorerError):
    """A request would take the server past its memory ceiling (503: the server is fine)."""


def parse_size(text: str) -> int:
    """Bytes of a size such as `4G`, `512M`, `1.5GB` or `800000000`."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.I)
    if not m:
        raise ExplorerError(f"--max-memory: {text!r} is not a size such as 4G or 512M")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def default_ceiling() -> int:
    """Half the memory this process may use (machine_bytes)."""
    return int(machine_bytes() * DEFAULT_SHARE)


def rss_bytes() -> int:
    """This process's resident memory now (/proc/self/statm)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def trim() -> None:
    """Collect garbage and hand freed heap back to the system (Arrow's pool, glibc's), so
    RSS falls."""
    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class MemoryCeiling:
    """The ceiling of one server: `admit` before work that reads a profile's tables, and a
    watcher thread that calls `relieve` (drop what other profiles keep in memory) when the
    process nears the ceiling."""

    def __init__(self, limit_bytes: int, relieve: Callable[[str | None], None]) -> None:
        self.limit = limit_bytes
        self.started = rss_bytes()  # what the server held when it started
        self._relieve = relieve
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        # bytes admitted to work still running, by thread, with the RSS when first admitted: two
        # requests admitted at once (a browser's view beside the warm-up's) must not each count
        # only on what RSS shows, nor on what the other already holds twice (in RSS too)
        self._reserved: dict[int, tuple[int, int]] = {}
        self._local = threading.local()
        self._ended = threading.Condition()  # notified when running work ends
        self.wait_s = WAIT_S

    def admit(self, need: int, what: str, keep: str | None = None) -> None:
        """Return if `need` more bytes fit under the ceiling beside what other threads' running
        work was admitted (waiting for that work to end when only it is in the way), after
        letting go of what is kept for profiles other than `keep` if they do not; else
        OverMemory, naming `what`. Inside `running`, `need` stays reserved until the block
        ends."""
        me = threading.get_ident()
        self._wait_for_others(me, need)
        if rss_bytes() + self._others(me) + need > self.limit:
            with self._lock:
                self._relieve(keep)
                trim()
            have = rss_bytes() + self._others(me)
            if have + need > self.limit:
                held = (f"the server holds {have >> 20:,} MB of its {self.limit >> 20:,} MB "
                        "ceiling")  # fmt: skip
                # what to do: a ceiling that admits it, or, where a server just started would,
                # a restart (what it holds now, the timeline's index and other profiles, is let
                # go; the disk cache stays)
                enough = -(-(have + need) * 10 // (1 << 30)) / 10
                restart = (", or a restart frees what the server holds now"
                           if self.started + need <= self.limit else "")  # fmt: skip
                raise OverMemory(
                    f"{what} needs about {need >> 20:,} MB, and {held} (--max-memory): refused; "
                    f"the server goes on serving (--max-memory {enough:g}G would admit it"
                    f"{restart})"
                    if need
                    else f"{held} (--max-memory), past it: refused until it falls back; the "
                    "server goes on serving"
                )
        if need and getattr(self._local, "depth", 0):
            with self._lock:
                had, at = self._reserved.get(me, (0, rss_bytes()))
                self._reserved[me] = (had + need, at)

    def _wait_for_others(self, me: int, need: int) -> None:
        """While other threads' running work keeps `need` out (what it was admitted, or what it
        holds), wait for that work to end (up to `wait_s`): a request waits for the warm-up, it
        is not refused."""
        deadline = time.monotonic() + self.wait_s
        with self._ended:
            while True:
                with self._lock:
                    running = any(t != me for t in self._reserved)
                others, have = self._others(me), rss_bytes()
                if not running or have + others + need <= self.limit:
                    return  # (what the others hold in RSS is let go when they end, too)
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._ended.wait(min(left, 1.0))

    def _others(self, me: int) -> int:
        """What other threads' running work was admitted and does not hold yet: its need less
        what the process grew since it was admitted (which RSS counts already)."""
        now = rss_bytes()
        with self._lock:
            return sum(max(0, need - max(0, now - at)) for t, (need, at) in self._reserved.items()
                       if t != me)  # fmt: skip

    @contextmanager
    def running(self) -> Iterator[None]:
        """A block of work: what it is admitted stays reserved until it ends (RSS then holds
        what the work kept)."""
        me = threading.get_ident()
        with self._lock:
            before = self._reserved.get(me)
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1
            with self._lock:
                if before:
                    self._reserved[me] = before
                else:
                    self._reserved.pop(me, None)
            with self._ended:
                self._ended.notify_all()

    def over(self) -> bool:
        """Whether the process is past its ceiling now (new work is refused until it is not)."""
        return rss_bytes() > self.limit

    def watch(self) -> None:
        """Start the watcher thread (once): past the ceiling (an estimate fell short), let go
        of every profile's kept data, so what requests left behind is not kept on top."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, daemon=True, name="memory")
            self._watcher.start()

    def _watch(self) -> None:
        stop = threading.Event()
        while not stop.wait(WATCH_S):
            if self.over():
                with self._lock:
                    self._relieve(None)
                    trim()


def pages_bytes(profile: Profile) -> int:
    """Bytes the analysis pages the import does not store hold for `profile` at their peak:
    PAGE_BASE_BYTES and PAGE_EVENT_BYTES an event (the footers' row count)."""
    return PAGE_BASE_BYTES + profile.footer_rows.get("events", 0) * PAGE_EVENT_BYTES

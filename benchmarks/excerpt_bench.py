"""A profile too big to analyse whole (issue 31): the excerpt the import cuts and analyses
(model/excerpt.py, analysis/scoped.py), then a fresh server under a memory ceiling that refuses
the whole profile, with an empty analysis cache: its first summary, findings and operators.

    .venv/bin/python benchmarks/excerpt_bench.py PROFILE [--budget 256M] [--max-memory 512M]

PROFILE is an imported profile (for the 1 GB trace: `neuron-explorer import
cuda_1000mb.pt.trace.json -o PROFILE --memory-budget 256M`, which cuts the excerpt itself; this
cuts it again, in a child process, to measure it alone: wall, CPU and peak memory). Run it from
the worktree's root so the children import this checkout.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CUT = """
import resource, sys, time
from neuron_explorer.analysis import stored
from neuron_explorer.analysis.scoped import store_excerpt
from neuron_explorer.model import Profile
p = Profile.open(sys.argv[1])
budget = int(sys.argv[2])
t0, c0 = time.perf_counter(), time.process_time()
part = store_excerpt(p, budget, stored.too_big(p, budget) or "benchmark")
print(f"{time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU, "
      f"peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MB, "
      f"{part.row_count('events'):,} events, steps {part.manifest.extra['excerpt']['steps']}")
"""


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].isalpha() else int(text)


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--budget", default="256M")
    ap.add_argument("--max-memory", default="512M")
    args = ap.parse_args()
    prof = args.profile.resolve()
    print(f"load average {os.getloadavg()[0]:.1f}")
    out = subprocess.run([sys.executable, "-c", CUT, str(prof), str(_size(args.budget))],
                         check=True, capture_output=True, text=True)  # fmt: skip
    print(f"excerpt (cut and analysed, budget {args.budget}): {out.stdout.strip()}")
    part = prof / "analysis" / "excerpt"
    print(f"excerpt on disk: {_du(part) / 1e6:.1f} MB (the profile: {_du(prof) / 1e6:.1f} MB)")
    with tempfile.TemporaryDirectory() as cache, socket_port() as port:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        proc = subprocess.Popen([sys.executable, "-m", "neuron_explorer", "serve", str(prof),
                                 "--port", str(port), "--max-memory", args.max_memory],
                                env=env, stdout=subprocess.DEVNULL)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(400):
                try:
                    httpx.get(base + "/static/app.css", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.05)
            name = prof.name
            for what in ("", "/findings", "/operators", "/modules"):
                cpu, t0 = _cpu_s(proc.pid), time.perf_counter()
                r = httpx.get(f"{base}/api/p/{name}{what}", timeout=600)
                wall = time.perf_counter() - t0
                scope = r.json().get("scope") if r.status_code == 200 else None
                print(f"GET /api/p/{name}{what}: {r.status_code} in {wall * 1e3:.0f} ms "
                      f"(server CPU {(_cpu_s(proc.pid) - cpu) * 1e3:.0f} ms)"
                      + (f"; {scope['line']}" if scope and not what else ""))  # fmt: skip
            rss = int(Path(f"/proc/{proc.pid}/statm").read_text().split()[1]) * os.sysconf(
                "SC_PAGE_SIZE")  # fmt: skip
            print(f"server resident memory after: {rss >> 20} MB (ceiling {args.max_memory})")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"this process: peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MB")
    return 0


class socket_port:
    """A free port on 127.0.0.1, as a context manager."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())

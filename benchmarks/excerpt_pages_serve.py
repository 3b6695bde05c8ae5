"""The analysis pages of a profile too big for the server's ceiling, beside its timeline (issue
31): `serve P --max-memory M` with an empty analysis cache, left to finish its warm-up (the
timeline's index, first view, name counts and pyramid: the server's CPU idle for 5 s), then the
timeline's first view and every analysis page the import does not store (read from the
excerpt), one at a time: each one's status, wall time, the server's CPU and its resident memory
(peak over the run sampled every 0.1 s, and the kernel's high-water mark).

    .venv/bin/python benchmarks/excerpt_pages_serve.py PROFILE [--max-memory 2G]

Nothing is written into PROFILE. Run it from the worktree's root so the server imports this
checkout.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx
from web_big_tour import Server


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--max-memory", default="2G")
    args = ap.parse_args()
    prof = args.profile.resolve()
    name = quote(prof.name)
    with tempfile.TemporaryDirectory() as cache:
        srv = Server(prof, args.max_memory, Path(cache))
        pid, c = srv.proc.pid, httpx.Client(base_url=srv.base, timeout=600)
        try:
            t0, last, idle_since = time.monotonic(), _cpu_s(pid), time.monotonic()
            while time.monotonic() - idle_since < 5:  # the warm-up's work done
                time.sleep(1)
                now = _cpu_s(pid)
                if now - last > 0.2:
                    idle_since = time.monotonic()
                last = now
            print(f"load average {os.getloadavg()[0]:.1f}; warm-up done in "
                  f"{time.monotonic() - t0 - 5:.0f} s ({_cpu_s(pid):.0f} s of server CPU), the "
                  f"server holds {srv.rss():,} MB (peak {srv.peak:,} MB)")  # fmt: skip
            api = f"/api/p/{name}"
            pages = [("summary", api), ("timeline: first view", api + "/timeline"),
                     ("modules", api + "/modules"), ("call tree (stack)", api + "/calltree"),
                     ("call tree (module)", api + "/calltree?by=module"),
                     ("memory", api + "/memory"), ("source", api + "/source"),
                     ("critical path", api + "/critical-path")]  # fmt: skip
            print("| request | status | wall s | server CPU s | server MB after | peak MB |")
            print("|---|---|---|---|---|---|")
            done: dict[str, dict] = {}
            i = 0
            while i < len(pages):
                label, url = pages[i]
                i += 1
                srv.peak, cpu, t = srv.rss(), _cpu_s(pid), time.perf_counter()
                r = c.get(url)
                wall, cpu = time.perf_counter() - t, _cpu_s(pid) - cpu
                note = "" if r.status_code == 200 else f": {r.json().get('error', '')[:160]}"
                print(f"| {label} | {r.status_code}{note} | {wall:.1f} | {cpu:.1f} | "
                      f"{srv.rss():,} | {srv.peak:,} |", flush=True)  # fmt: skip
                doc = done[label] = r.json() if r.status_code == 200 else {}
                if label == "timeline: first view" and doc.get("extent"):
                    s0, e0 = doc["extent"]["start_ns"], doc["extent"]["end_ns"]
                    for share in (0.25, 0.001):  # the tour's wide span, and a zoomed one
                        q = f"start_ns={s0}&end_ns={s0 + int((e0 - s0) * share)}"
                        pages.insert(i, (f"span flame graph, {share:.1%} of the profile",
                                         f"{api}/span/flame?{q}"))  # fmt: skip
                if label == "source" and doc.get("top_lines"):
                    top = doc["top_lines"][0]
                    pages.insert(i, ("source: its top line's panel",
                                     f"{api}/source/{top['file_id']}/lines/{top['line']}"))  # fmt: skip
                if label == "critical path" and doc.get("ops"):
                    op = next(o["label"] for o in doc["ops"] if not o["label"].startswith("("))
                    step = doc["label"].removeprefix("step ")
                    pages += [
                        (
                            "what-if (its top op 2x)",
                            f"{api}/whatif?speedup={quote(op)}%3D2&step={step}",
                        ),
                        ("compare (with itself)", f"/api/compare?a={name}&b={name}"),
                    ]
            print(f"server high-water mark {srv.hwm():,} MB (ceiling {args.max_memory}); "
                  f"{_cpu_s(pid):.0f} s of server CPU in all")  # fmt: skip
        finally:
            srv.proc.terminate()
            srv.proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())

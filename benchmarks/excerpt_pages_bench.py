"""What each analysis page of a profile really holds in a fresh server process (issue 31): the
process's resident memory (Arrow and DuckDB included, which tracemalloc misses) before and
after each page is computed, and its peak while it is, to fit model/footprint.py's estimate.

    .venv/bin/python benchmarks/excerpt_pages_bench.py PROFILE [--max-memory 16G]

PROFILE is one imported profile (an excerpt's folder, PROFILE/analysis/excerpt, is one too);
nothing is written into it (the analysis cache is a temporary folder). The app runs in this
process without its warm-up, so each page's memory is its own; run it from the worktree's
root so it imports this checkout.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

from fastapi.testclient import TestClient

from neuron_explorer.model import Profile, footprint
from neuron_explorer.web.app import create_app
from neuron_explorer.web.memory import rss_bytes

MB = 1 << 20


class Peak:
    """The process's resident memory sampled every 10 ms on a thread: the highest since reset."""

    def __init__(self) -> None:
        self.high = rss_bytes()
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.high = max(self.high, rss_bytes())

    def reset(self) -> int:
        now = rss_bytes()
        self.high = now
        return now


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].isalpha() else int(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--max-memory", default="16G")
    ap.add_argument(
        "--duckdb-memory",
        default="512M",
        help="each DuckDB connection's limit (a 2G server's: a quarter of it)",
    )
    ap.add_argument("--pages-only", action="store_true",
                    help="skip what the import stores (summary, findings, operators, source) and "
                    "compare, which reads them: the other pages' memory alone")  # fmt: skip
    args = ap.parse_args()
    prof = args.profile.resolve()
    p = Profile.open(prof)
    events = p.footer_rows.get("events", 0)
    print(f"load average {os.getloadavg()[0]:.1f}; {prof}: {events:,} events, footers "
          f"{p.footer_bytes / MB:,.0f} MB; estimate: tables {footprint.tables_bytes(p) / MB:,.0f} MB, "
          f"analysis {footprint.analysis_bytes(p) / MB:,.0f} MB")  # fmt: skip
    with tempfile.TemporaryDirectory() as cache:
        start = rss_bytes()
        app = create_app(prof.parent, analysis_cache=cache, max_memory=_size(args.max_memory))
        app.state.service.store.duckdb_memory = _size(args.duckdb_memory)
        client = TestClient(app)  # not entered: no warm-up, each page computed when asked
        name = quote(prof.name)
        peak = Peak()
        print(
            f"process before any table is read: {start / MB:,.0f} MB "
            f"(app made: {rss_bytes() / MB:,.0f} MB)"
        )
        print("| page | status | wall s | CPU s | RSS after MB | peak MB | peak over start MB |")
        print("|---|---|---|---|---|---|---|")
        api = f"/api/p/{name}"
        pages = [("summary", api), ("findings", api + "/findings"),
                 ("operators", api + "/operators"), ("modules", api + "/modules"),
                 ("call tree (stack)", api + "/calltree?by=stack"),
                 ("call tree (module)", api + "/calltree?by=module"), ("memory", api + "/memory"),
                 ("source", api + "/source"), ("critical path", api + "/critical-path"),
                 ("compare (with itself)", f"/api/compare?a={name}&b={name}")]  # fmt: skip
        if args.pages_only:
            stored = ("summary", "findings", "operators", "source", "compare (with itself)")
            pages = [(label, url) for label, url in pages if label not in stored]
        done: dict[str, object] = {}
        i = 0
        while i < len(pages):
            label, url = pages[i]
            i += 1
            base = peak.reset()
            t0, c0 = time.perf_counter(), time.process_time()
            r = client.get(url)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            after = rss_bytes()
            print(
                f"| {label} | {r.status_code} | {wall:.1f} | {cpu:.1f} | {after / MB:,.0f} | "
                f"{peak.high / MB:,.0f} | {(peak.high - start) / MB:,.0f} |",
                flush=True,
            )
            del base
            if r.status_code != 200:
                continue
            done[label] = r.json()
            if label == "source":
                top = done[label].get("top_lines") or []  # type: ignore[union-attr]
                if top:
                    pages.insert(i, ("source: a file", f"{api}/source/{top[0]['file_id']}"))
                    pages.insert(
                        i + 1,
                        (
                            "source: its top line",
                            f"{api}/source/{top[0]['file_id']}/lines/{top[0]['line']}",
                        ),
                    )
            if label == "critical path":
                doc = done[label]
                # the path's longest op (the operators page's top one where it was asked)
                ops = [
                    o.get("name") or o["label"]
                    for o in (done.get("operators") or {}).get("operators")  # type: ignore[union-attr]  # type: ignore[union-attr]
                    or doc.get("ops")
                    or []
                ]  # type: ignore[union-attr]
                ops = [o for o in ops if not o.startswith("(")]  # not "(host, outside any op)"
                step = re.fullmatch(r"step (\d+)", str(doc.get("label")))  # type: ignore[union-attr]
                if ops:
                    q = f"speedup={quote(ops[0])}%3D2" + (f"&step={step[1]}" if step else "")
                    pages.insert(i, ("what-if (top op 2x)", f"{api}/whatif?{q}"))
        final = rss_bytes()
        print(f"held after every page: {final / MB:,.0f} MB ({(final - start) / MB:,.0f} MB over "
              f"the start; {(final - start) / max(events, 1):,.0f} B an event); process peak "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A profile whose excerpt's stored analysis is stale, as after an upgrade that changes the
analysis code (issue 31): a fresh server under `--max-memory` computes it again when the
excerpt fits (the import sized it by the server's estimate, model/footprint.py), else serves
the stale one saying so (`scope.stale`); each analysis page's status, wall and server CPU time,
and the server's memory.

    .venv/bin/python benchmarks/excerpt_stale_bench.py PROFILE MAX_MEMORY [--make-stale]

`--make-stale` rewrites the code half of the first line of every file in the excerpt's
analysis/ folder (docs/format.md, "Stored analysis"): run it on a copy of the profile (`cp -r`),
and `neuron-explorer analyze COPY --store` to store it anew. Run it from the worktree's root.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from web_bench import _cpu_ms, _start_server
from web_big_bench import _vm

from neuron_explorer.web.memory import parse_size


def make_stale(profile: Path) -> None:
    """What an earlier version of the code left: the same tables' identity, another code's."""
    for f in (profile / "analysis" / "excerpt" / "analysis").iterdir():
        head, _, body = f.read_bytes().partition(b"\n")
        code, _, tables = head.partition(b" ")
        f.write_bytes(b"0" * len(code) + b" " + tables + b"\n" + body)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile", type=Path)
    ap.add_argument("max_memory")
    ap.add_argument("--make-stale", action="store_true")
    args = ap.parse_args()
    if args.make_stale:
        make_stale(args.profile)
    cache = Path(tempfile.mkdtemp(prefix="excerpt-stale-cache-"))
    proc, base = _start_server(args.profile, cache, parse_size(args.max_memory))
    print(f"| server started | {_vm(proc)} |")
    try:
        with httpx.Client(base_url=base, timeout=600) as c:
            for page in ("", "/findings", "/operators", "/modules"):
                cpu, t0 = _cpu_ms(proc), time.perf_counter()
                r = c.get(f"/api/p/{args.profile.name}{page}")
                ms, cpu = (time.perf_counter() - t0) * 1e3, _cpu_ms(proc) - cpu
                doc = r.json()
                what = f"stale: {(doc.get('scope') or {}).get('stale', False)}"
                if r.status_code != 200:
                    what = doc.get("error", "")[:160]
                print(f"| /api/p/NAME{page} | {r.status_code} in {ms:,.0f} ms (server CPU "
                      f"{cpu:,.0f} ms); {what}; {_vm(proc)} |")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

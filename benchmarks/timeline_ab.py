"""The timeline on a large profile, in-process, this checkout against an earlier revision,
alternated: the index (lanes, extent, long events), the whole-profile view (1500 px), 30
windows of 0.1-5% of the profile (p50) and two finds, each as wall and CPU time, with the load.

    .venv/bin/python benchmarks/timeline_ab.py PROFILE [--before REV] [--rounds 4]

PROFILE is a profile directory, e.g. the import of benchmarks/big_trace.py's 1 GB trace. REV's
package is unpacked with `git archive` into a temporary folder; each side of each round runs
in a fresh process, the order of the sides swapped every round.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, random, statistics, sys, time
from neuron_explorer.model import Profile
from neuron_explorer.web.views.search import search_events

p = Profile.open(sys.argv[1])
con = p.duckdb()
try:  # analysis.timeline since issue 16; the web's view before
    from neuron_explorer.analysis import timeline as t
    build = lambda: t.build_index(p)
    window = lambda idx, s, e: t.window(p, idx, s, e, 1500, con=con)
except ImportError:
    from neuron_explorer.web.views import timeline as t
    build = lambda: t.build_index(p, con)
    window = lambda idx, s, e: t.window(p, con, idx, s, e, 1500)

def timed(fn):
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c, time.perf_counter() - w

out = {}
idx, out["index_cpu"], out["index_wall"] = timed(build)
_, out["whole_cpu"], out["whole_wall"] = timed(lambda: window(idx, idx.start_ns, idx.end_ns))
rnd, span, walls, cpus = random.Random(0), idx.end_ns - idx.start_ns, [], []
for _ in range(30):
    width = int(span * rnd.uniform(0.001, 0.05))
    s = idx.start_ns + rnd.randrange(max(1, span - width))
    _, c, w = timed(lambda: window(idx, s, s + width))
    cpus.append(c), walls.append(w)
out["window_p50_wall"], out["window_p50_cpu"] = statistics.median(walls), statistics.median(cpus)
for key, q, regex in (("find", "addmm", False), ("find_regex", "^aten::(relu|add_)$", True)):
    _, out[key + "_cpu"], out[key + "_wall"] = timed(lambda: search_events(con, q, regex, 1000, p))
print(json.dumps(out))
"""


def _side(tree: Path, profile: Path) -> dict[str, float]:
    run = subprocess.run([sys.executable, "-c", CHILD, str(profile)], cwd=tree, check=True,
                         capture_output=True, text=True)  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])


def _fmt(r: dict[str, float]) -> str:
    ms = {k: round(v * 1000) for k, v in r.items()}
    return (f"index {ms['index_wall']} ms (CPU {ms['index_cpu']}), whole view {ms['whole_wall']} "
            f"ms (CPU {ms['whole_cpu']}), windows p50 {ms['window_p50_wall']} ms (CPU "
            f"{ms['window_p50_cpu']}), find {ms['find_wall']} / regex {ms['find_regex_wall']} ms")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--before", default="HEAD~1", help="the revision to compare with")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    old = Path(tempfile.mkdtemp(prefix="timeline-ab-"))
    try:
        archive = subprocess.run(["git", "archive", args.before, "neuron_explorer"], cwd=ROOT,
                                 check=True, capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        sides = {"before": old, "after": ROOT}
        for i in range(args.rounds):
            for label in ("before", "after") if i % 2 == 0 else ("after", "before"):
                load = Path("/proc/loadavg").read_text().split()[0]
                r = _side(sides[label], args.profile.resolve())
                after = Path("/proc/loadavg").read_text().split()[0]
                print(f"round {i + 1} {label:6}: {_fmt(r)}; load {load}-{after}", flush=True)
    finally:
        shutil.rmtree(old, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time the step's dependency graph, its replay and its critical path on the real traces in
tests/data/kineto-gpu and the captured samples (benchmarks/README.md, "Critical path").

    python benchmarks/critical_path_bench.py

Each profile: the median step (or the whole trace without steps) built, replayed as recorded
and walked (`critical_path`, which also replays its top device ops at 2x), best of 3 wall times
in a fresh import; the graph's nodes and edges.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = sorted((ROOT / "tests" / "data" / "kineto-gpu").glob("*.json.gz"))
SAMPLES = sorted(p for p in (ROOT / "samples" / "profiles").iterdir() if p.is_dir())


def main() -> None:
    from neuron_explorer.analysis.critical_path import path_of
    from neuron_explorer.analysis.depgraph import build_graph
    from neuron_explorer.importers import import_traces
    from neuron_explorer.model.profile import Profile

    tmp = Path(tempfile.mkdtemp(prefix="cp-bench-"))
    profiles = [(p.name.split(".")[0][:40], Profile.open(import_traces([p], tmp / p.name)))
                for p in TRACES if "cpu_only" not in p.name]  # fmt: skip
    profiles += [(p.name, Profile.open(p)) for p in SAMPLES]
    print("| profile | events | graph nodes | edges | build s | critical path s |")
    print("|---|---|---|---|---|---|")
    for name, prof in profiles:
        builds, paths = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            graph = build_graph(prof)
            t1 = time.perf_counter()
            path_of(graph, name)
            builds.append(t1 - t0)
            paths.append(time.perf_counter() - t1)
        print(f"| {name} | {prof.manifest.row_counts.get('events', 0):,} | {len(graph.nodes):,} "
              f"| {len(graph.edges):,} | {min(builds):.2f} | {min(paths):.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()

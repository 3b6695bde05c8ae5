"""collective-share's numbers (per rank: collective time inside the steps, the part of it other
device compute overlaps, the step time) equal a brute-force count over elementary time
segments, on real multi-rank profiles: two real Kineto traces imported as ranks 0 and 1 (the
NCCL one has kernels overlapping its collectives) and the DDP straggler sample captured on the
neuron device. The rule measures them by merging and a binary search (analysis/intervals.py)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from test_analysis_profiles import SHARED, TRACES, sample

from neuron_explorer.analysis import get_rule
from neuron_explorer.analysis.context import context
from neuron_explorer.analysis.conventions import COMPUTE_KINDS
from neuron_explorer.model.profile import Profile


def measure_of(*sets: list[tuple[int, int]]) -> int:
    """The time that lies inside at least one interval of EVERY set: each elementary segment
    between consecutive boundaries, checked against a running count per set."""
    edges: list[tuple[int, int, int]] = []  # (time, set, +1 opens / -1 closes)
    for k, spans in enumerate(sets):
        for s, e in spans:
            if e > s:
                edges += [(s, k, 1), (e, k, -1)]
    edges.sort()
    open_count = [0] * len(sets)
    total, last = 0, None
    for t, k, step in edges:
        if last is not None and t > last and all(open_count):
            total += t - last
        open_count[k] += step
        last = t
    return total


def brute_force(profile: Profile) -> list[dict]:
    """Per rank: rank, coll, overlap, step_ns, from the events read row by row."""
    rows = profile.table("events", columns=["rank", "layer", "kind", "name", "step", "start_ns",
                                            "dur_ns"]).to_pylist()  # fmt: skip
    windows: dict[tuple, list[int]] = {}
    for r in rows:
        if r["kind"] == "step" and r["layer"] == "host":
            step = r["step"]
            if step is None:
                m = re.search(r"#(\d+)", r["name"] or "")
                step = int(m.group(1)) if m else None
            w = windows.setdefault((r["rank"], step), [r["start_ns"], r["start_ns"] + r["dur_ns"]])
            w[0], w[1] = min(w[0], r["start_ns"]), max(w[1], r["start_ns"] + r["dur_ns"])
    ranks = sorted({r["rank"] for r in rows})
    if not windows:  # no steps: one window per rank over all its events
        for rank in ranks:
            mine = [r for r in rows if r["rank"] == rank]
            windows[(rank, None)] = [min(r["start_ns"] for r in mine),
                                     max(r["start_ns"] + r["dur_ns"] for r in mine)]  # fmt: skip
    spans: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "collective" and r["layer"] in ("host", "device"):
            spans[(r["rank"], r["layer"])].append((r["start_ns"], r["start_ns"] + r["dur_ns"]))
        elif r["layer"] == "device" and r["kind"] in COMPUTE_KINDS:
            spans[(r["rank"], "compute")].append((r["start_ns"], r["start_ns"] + r["dur_ns"]))
    out = []
    for rank in sorted({rank for rank, _ in windows}):
        steps = [tuple(w) for (k, _), w in windows.items() if k == rank]
        device = spans[(rank, "device")]
        coll = device or spans[(rank, "host")]
        other = spans[(rank, "compute")] if device else []
        out.append({"rank": rank, "coll": measure_of(coll, steps),
                    "overlap": measure_of(coll, steps, other),
                    "step_ns": sum(e - s for s, e in steps)})  # fmt: skip
    return [r for r in out if r["coll"] > 0 or len(out) > 1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Profile:
    from neuron_explorer.importers import import_traces

    paths = [SHARED / TRACES["nccl"], SHARED / TRACES["compare_base"]]
    out = tmp_path_factory.mktemp("cs") / "two-ranks"
    return Profile.open(import_traces(paths, out, mixed_runs=True))


def test_collective_share_equals_brute_force_on_two_real_ranks(two_ranks):
    expected = brute_force(two_ranks)
    facts = get_rule("collective-share").measure(context(two_ranks))
    assert facts is not None and list(facts.rows) == expected
    assert expected[0]["overlap"] > 0  # the NCCL trace's kernels run during its collectives
    (f,) = get_rule("collective-share").evaluate(two_ranks)
    assert f.evidence.metrics["collective_ns"] == sum(r["coll"] for r in expected)
    assert f.evidence.metrics["exposed_ns"] == sum(r["coll"] - r["overlap"] for r in expected)


def test_collective_share_equals_brute_force_on_the_captured_ddp_sample():
    profile = sample("ddp_straggler")
    facts = get_rule("collective-share").measure(context(profile))
    assert facts is not None and list(facts.rows) == brute_force(profile)

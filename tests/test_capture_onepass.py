"""Capture maps torch.profiler's trace in memory, in one pass: the host tables it merges equal
what an import of the same trace writes, and no profile of the host events alone is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import neuron_explorer
from neuron_explorer.capture.handler import write_profile
from neuron_explorer.importers import import_traces
from neuron_explorer.importers.assemble import assemble
from neuron_explorer.importers.kineto import load
from neuron_explorer.model import Profile

DATA = Path(__file__).parent / "data"
TRACES = [
    DATA / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz",
    DATA / "kineto-gpu" / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name.split(".")[0])
def test_the_in_memory_tables_equal_the_imported_profile(tmp_path, trace):
    """Events, stacks, counters and the manifest's times and steps, as capture reads them
    (assemble) and as `import` writes them to disk."""
    written = Profile.open(import_traces([trace], tmp_path / "p", thread_names=False))
    mem = assemble([load(trace, thread_names=False)])
    events = mem.events()
    assert events.num_rows == written.manifest.row_counts["events"] > 0
    for name, table in (("events", events), ("stacks", mem.stacks), ("counters", mem.counters)):
        disk = written.table(name)
        assert table.column_names == disk.column_names
        for col in table.column_names:
            assert table.column(col).to_pylist() == disk.column(col).to_pylist(), (name, col)
    m, w = mem.manifest, written.manifest
    assert (m.origin_unix_ns, m.steps, m.ranks, m.host) == (
        w.origin_unix_ns,
        w.steps,
        w.ranks,
        w.host,
    )


def test_a_capture_writes_only_its_profile(tmp_path):
    """After the merge is written, the capture's temporary folder still holds torch's exported
    trace alone: no profile of the host events was written beside it to be read back."""
    handler = neuron_explorer.trace_handler(tmp_path / "out")
    left: list[list[str]] = []

    def on_ready(prof):
        raw = handler.collect(prof)
        try:
            write_profile(raw, tmp_path / "out")
            left.append(sorted(os.listdir(raw.workdir)))
        finally:
            handler.discard(raw)

    x = torch.randn(8, 8, device="neuron")
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], on_trace_ready=on_ready
    ):
        (x @ x).relu().sum().item()
    assert left == [["trace.json"]]
    prof = Profile.open(tmp_path / "out")
    assert prof.manifest.source == "capture"
    kinds = set(prof.table("events").column("kind").to_pylist())
    assert {"op", "runtime", "kernel"} <= kinds

"""The analysis reads args/shapes/dtypes for the rows that need them only (analysis/sparse.py):
the events table it builds is the one a whole read builds, on real traces, one rank or two
(one Parquet file per rank), and a scan that selects other rows than asked is refused."""

from __future__ import annotations

import numpy as np
import pytest
from test_analysis_profiles import SHARED, TRACES, real

from neuron_explorer.analysis import context as ctx_module
from neuron_explorer.analysis.context import AnalysisContext
from neuron_explorer.analysis.sparse import sparse_columns
from neuron_explorer.model.profile import Profile


def events_read(profile: Profile, min_rows: int, monkeypatch) -> tuple:
    monkeypatch.setattr(ctx_module, "SPARSE_MIN_ROWS", min_rows)
    ctx = AnalysisContext(profile)
    return ctx.events, ctx


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Profile:
    from neuron_explorer.importers import import_traces

    paths = [SHARED / TRACES["nccl"], SHARED / TRACES["compare_base"]]
    out = tmp_path_factory.mktemp("sparse") / "two-ranks"
    return Profile.open(import_traces(paths, out, mixed_runs=True))


@pytest.mark.parametrize("name", ["nccl", "alexnet", "two_ranks"])
def test_the_sparse_read_builds_the_same_events(name, two_ranks, monkeypatch):
    profile = two_ranks if name == "two_ranks" else real(name)
    whole, _ = events_read(profile, 10**12, monkeypatch)
    sparse, ctx = events_read(profile, 0, monkeypatch)
    keep = ctx.cols.where("kind", ctx_module.ARGS_KINDS)
    assert keep.any() and not keep.all()  # some rows keep their args, others drop them
    assert ctx._sparse_heavy(keep | ctx.cols.where("name", (ctx_module.DOWNCAST_EVENT,)))
    assert sparse.equals(whole)
    assert sparse["args"].null_count < sparse.num_rows  # the kept rows' args are there


def test_a_scan_that_selects_other_rows_is_refused():
    profile = real("nccl")
    n = profile.row_count("events")
    keep = np.zeros(n, dtype=bool)
    keep[:3] = True  # the first three rows, which are not all of the collectives
    assert sparse_columns(profile, ("args",), keep, "kind = 'collective'", []) is None

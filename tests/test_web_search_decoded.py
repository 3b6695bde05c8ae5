"""The timeline's find reuses the analysis context's decoded names when the summary has built
them (web/views/search.py): on real traces and a neuron capture it answers exactly what the
plain SQL path answers, and so does the read of the Parquet dictionary before that."""

from __future__ import annotations

import pytest
from test_analysis_profiles import real, sample

from neuron_explorer.analysis.context import context
from neuron_explorer.model.profile import Profile
from neuron_explorer.web.views.search import _decoded, search_events


@pytest.mark.parametrize("name", ["alexnet", "nccl", "sample:gpt_train"])
@pytest.mark.parametrize(("q", "regex"), [("mm", False), ("^aten::(add|mul)", True),
                                          ("NCCL", False), ("no such name", False)])  # fmt: skip
def test_find_with_the_decoded_names_equals_the_sql_path(name, q, regex):
    path = (sample(name[7:]) if name.startswith("sample:") else real(name)).path
    fresh = Profile.open(path)  # a context of its own, not yet decoded
    con = fresh.duckdb()
    plain = search_events(con, q, regex, 50)
    assert _decoded(fresh) is None
    assert search_events(con, q, regex, 50, profile=fresh) == plain
    context(fresh).events  # noqa: B018 - what the summary page builds
    assert _decoded(fresh) is not None
    assert search_events(con, q, regex, 50, profile=fresh) == plain

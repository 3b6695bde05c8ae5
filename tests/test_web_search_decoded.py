"""The timeline's find (analysis/search.py) reuses the analysis context's decoded names when the
summary has built them: on real traces and a neuron capture it answers exactly what the plain
SQL path (search_sql) answers, and so does the read of the Parquet dictionary before that."""

from __future__ import annotations

import pytest
from test_analysis_profiles import real, sample

from neuron_explorer.analysis.context import context
from neuron_explorer.analysis.search import _decoded, search, search_sql
from neuron_explorer.model.profile import Profile


@pytest.mark.parametrize("name", ["alexnet", "nccl", "sample:gpt_train"])
@pytest.mark.parametrize(("q", "regex"), [("mm", False), ("^aten::(add|mul)", True),
                                          ("NCCL", False), ("no such name", False)])  # fmt: skip
def test_find_with_the_decoded_names_equals_the_sql_path(name, q, regex):
    path = (sample(name[7:]) if name.startswith("sample:") else real(name)).path
    fresh = Profile.open(path)  # a context of its own, not yet decoded
    con = fresh.duckdb()
    plain = search_sql(con, q, regex, 50)
    assert _decoded(fresh) is None
    assert search(fresh, q, regex, 50) == plain
    context(fresh).events  # noqa: B018 - what the summary page builds
    assert _decoded(fresh) is not None
    assert search(fresh, q, regex, 50, con) == plain
    assert plain.total >= len(plain.matches) and plain.truncated == (plain.total > 50)


@pytest.mark.parametrize(("q", "regex"), [("mm", False), ("^aten::(add|mul)", True)])
def test_find_file_by_file_reads_only_the_row_groups_of_the_first_matches(tmp_path, q, regex):
    """Without decoded names the find reads the match columns only from the row groups that
    hold each rank's first matches: on the two-rank sample (a file per rank), and on a copy
    of the one-rank capture rewritten in row groups of 97 rows, it answers what SQL answers."""
    import shutil

    import pyarrow.parquet as pq

    small = tmp_path / "gpt_train"
    shutil.copytree(sample("gpt_train").path, small)
    events = pq.read_table(small / "events.parquet")
    pq.write_table(events, small / "events.parquet", row_group_size=97)
    assert pq.ParquetFile(small / "events.parquet").num_row_groups > 10
    for path in (small, sample("ddp_straggler").path):
        p = Profile.open(path)
        for limit in (7, 1000):  # fewer than one rank's matches, and all of them
            found = search(p, q, regex, limit)
            assert found == search_sql(p.duckdb(), q, regex, limit), (path.name, limit)
            assert found.total > limit or limit == 1000

"""Fleets on a real local Spark: the rank-partitioned profile of a real 4-rank capture read by
Spark SQL and DuckDB, docs/fleet.md's queries run as written, and the Spark import job.

Behind the `sweep` marker (make test-sweep): a Spark session and a 4-rank job take minutes on
two cores. pyspark and Java come from the sweep set-up (requirements-sweep.txt, Debian's JDK).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from test_distributed import PROFILE_WORKER, SLEEP_S, torchrun

FLEET_MD = Path(__file__).resolve().parents[1] / "docs" / "fleet.md"
SLOW_RANK = 2

pytestmark = pytest.mark.sweep


def doc_queries() -> dict[str, str]:
    """The SQL blocks of docs/fleet.md that start with `-- query: NAME`."""
    blocks = re.findall(r"```sql\n(.*?)```", FLEET_MD.read_text(encoding="utf-8"), re.S)
    out = {}
    for b in blocks:
        m = re.match(r"-- query: (\w+)\n", b)
        if m:
            out[m.group(1)] = b[m.end() :]
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, Path]:
    """(profile, directory of the ranks' raw Kineto traces) of a 4-rank DDP job, rank 2 slow."""
    root = tmp_path_factory.mktemp("fleet")
    (root / "kineto").mkdir()
    torchrun(PROFILE_WORKER, 4, str(root / "run"), str(SLOW_RANK), str(SLEEP_S), timeout=600,
             env={"KINETO_DIR": str(root / "kineto")})  # fmt: skip
    return root / "run", root / "kineto"


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver binds loopback, never eth0
    os.environ["PYSPARK_PYTHON"] = sys.executable  # tasks run in this venv's Python

    session = (
        SparkSession.builder.master("local[2]")
        .appName("neuron-explorer-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    yield session
    session.stop()


def test_spark_sql_finds_the_straggler_analyze_finds(job, spark):
    from neuron_explorer.analysis import run_rules
    from neuron_explorer.model import Profile

    profile, _ = job
    analyzed = {
        f.evidence.metrics["rank"]
        for f in run_rules(Profile.open(profile))
        if f.rule == "straggler"
    }
    assert analyzed == {SLOW_RANK}
    events = spark.read.parquet(str(profile / "events"))
    assert sorted(r["rank"] for r in events.select("rank").distinct().collect()) == [0, 1, 2, 3]
    events.createOrReplaceTempView("events")
    q = doc_queries()
    assert {r["rank"] for r in spark.sql(q["stragglers"]).collect()} == analyzed
    steps = spark.sql(q["rank_steps"]).collect()
    assert [r["rank"] for r in steps] == [0, 1, 2, 3] and all(r["steps"] == 7 for r in steps)
    # the slow rank waits least: the others wait for it
    assert min(steps, key=lambda r: r["wait_ns"])["rank"] == SLOW_RANK
    skew = spark.sql(q["collective_skew"]).collect()
    assert skew and skew[0]["last_rank_to_arrive"] == SLOW_RANK
    # the web's ranks page opens on a rank that waited against the one it waited for
    from neuron_explorer.analysis.rank_compare import default_pair

    assert default_pair(Profile.open(profile))[1] == SLOW_RANK


def test_duckdb_reads_the_partitions_with_hive_partitioning(job):
    import duckdb

    profile, _ = job
    rows = duckdb.sql(
        f"SELECT rank, count(*) FROM read_parquet('{profile}/events/*/*.parquet', "
        "hive_partitioning = true) GROUP BY rank ORDER BY rank"
    ).fetchall()
    assert [r[0] for r in rows] == [0, 1, 2, 3] and all(r[1] > 100 for r in rows)


def test_the_import_as_a_spark_job_equals_the_plain_import(job, spark, tmp_path):
    import pyarrow.compute as pc

    from neuron_explorer.fleet import import_with_spark
    from neuron_explorer.importers import import_traces
    from neuron_explorer.model import Profile

    _, kineto = job
    traces = sorted(kineto.glob("rank*.json"))
    assert len(traces) == 4
    spark_made = Profile.open(import_with_spark(spark, traces, tmp_path / "spark"))
    plain = Profile.open(import_traces(traces, tmp_path / "plain"))
    assert spark_made.manifest.ranks == plain.manifest.ranks == (0, 1, 2, 3)
    assert sorted((tmp_path / "spark" / "events").iterdir()) != []

    def rows(p: Profile, rank: int) -> int:
        return p.table("events", ["rank"], filter=pc.field("rank") == rank).num_rows

    for rank in range(4):
        assert rows(spark_made, rank) == rows(plain, rank) > 0

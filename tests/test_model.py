"""The profile model: atomic writes, lazy reads, and clear errors on bad profiles."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest

from neuron_explorer.errors import BadInputError, ExplorerError
from neuron_explorer.model import Manifest, Profile, ProfileWriter, Step
from neuron_explorer.model.schema import EVENTS, SCHEMA_VERSION


def _events(n: int, ranks=(0,)) -> dict:
    ids = list(range(n * len(ranks)))
    return {
        "id": ids,
        "rank": [r for r in ranks for _ in range(n)],
        "layer": ["host"] * len(ids),
        "kind": ["op"] * len(ids),
        "name": [f"aten::op{i % 3}" for i in ids],
        "track": ["thread 1"] * len(ids),
        "start_ns": [(n - i % n) * 1000 for i in ids],  # reversed, so the writer must sort
        "dur_ns": [500] * len(ids),
    }


def test_round_trip_sorts_and_counts(tmp_path):
    out = tmp_path / "p"
    with ProfileWriter(out) as w:
        w.write_events(_events(10))
        w.add_source("/home/u/train.py", "print('hi')\n")
        w.commit(Manifest(source="kineto", origin_unix_ns=1, steps=(Step(1, 0, 0, 10),)))
    prof = Profile.open(out)
    ev = prof.table("events")
    assert ev.schema.equals(EVENTS.arrow_schema(), check_metadata=False)
    assert ev.column("start_ns").to_pylist() == sorted(ev.column("start_ns").to_pylist())
    assert prof.manifest.row_counts == {"events": 10, "stacks": 0, "counters": 0}
    assert prof.manifest.steps[0].step == 1
    assert prof.source_text("/home/u/train.py") == "print('hi')\n"
    con = prof.duckdb()
    assert con.execute("select count(*) from events where kind = 'op'").fetchone()[0] == 10
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_several_ranks_are_partitioned(tmp_path):
    out = tmp_path / "p"
    with ProfileWriter(out) as w:
        w.write_events(_events(5, ranks=(0, 3)))
        w.commit(Manifest(source="kineto", origin_unix_ns=1, ranks=(0, 3)))
    assert (out / "events" / "rank=3" / "part-0.parquet").is_file()
    prof = Profile.open(out)
    ranks = prof.table("events", columns=["rank"]).column("rank").to_pylist()
    assert sorted(set(ranks)) == [0, 3] and len(ranks) == 10


def test_interrupted_write_leaves_nothing(tmp_path):
    out = tmp_path / "p"
    with pytest.raises(RuntimeError):
        with ProfileWriter(out) as w:
            w.write_events(_events(3))
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_refused(tmp_path):
    (tmp_path / "p").mkdir()
    with pytest.raises(ExplorerError, match="exists"):
        ProfileWriter(tmp_path / "p")


def test_unknown_column_is_refused(tmp_path):
    with ProfileWriter(tmp_path / "p") as w, pytest.raises(ValueError, match="unknown"):
        w.write_events({**_events(1), "bogus": [1]})


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda p: (p / "manifest.json").unlink(), "manifest.json is missing"),
        (lambda p: (p / "stacks.parquet").unlink(), "table stacks is missing"),
        (lambda p: (p / "manifest.json").write_text("{"), "unreadable manifest"),
        (lambda p: (p / "manifest.json").write_text('{"format": "x"}'), "not a neuron-explorer"),
        (
            lambda p: (p / "manifest.json").write_text(
                json.dumps(
                    {"format": "neuron-explorer-profile", "schema_version": SCHEMA_VERSION + 1}
                )
            ),
            "newer",
        ),
    ],
)
def test_damaged_profiles_give_clear_errors(tmp_path, damage, message):
    out = tmp_path / "p"
    with ProfileWriter(out) as w:
        w.write_events(_events(2))
        w.commit(Manifest(source="kineto", origin_unix_ns=1))
    damage(out)
    with pytest.raises(BadInputError, match=message):
        Profile.open(out)


def test_corrupt_parquet_gives_clear_error(tmp_path):
    out = tmp_path / "p"
    with ProfileWriter(out) as w:
        w.write_events(_events(2))
        w.commit(Manifest(source="kineto", origin_unix_ns=1))
    (out / "events.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(BadInputError, match="corrupt Parquet"):
        Profile.open(out).table("events")


def test_schema_version_is_in_parquet_metadata(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "p"
    with ProfileWriter(out) as w:
        w.write_events(pa.table(_events(1)))
        w.commit(Manifest(source="kineto", origin_unix_ns=1))
    meta = pq.read_schema(out / "events.parquet").metadata
    assert meta[b"neuron_explorer.schema_version"] == str(SCHEMA_VERSION).encode()


def test_a_table_as_one_parquet_file_is_its_own_file_or_its_parts_reencoded():
    """Profile.parquet (the web's table download): a table in one file is that file; the
    events of a two-rank job (one file per rank) come back as one file holding every row."""
    import io
    from pathlib import Path

    import pyarrow.parquet as pq

    p = Profile.open(Path(__file__).resolve().parents[1] / "samples" / "profiles" / "ddp_straggler")
    assert p.parquet("counters") == p.path / "counters.parquet"
    data = p.parquet("events")
    assert isinstance(data, bytes) and (p.path / "events").is_dir()
    back = pq.read_table(io.BytesIO(data))
    assert back.num_rows == p.row_count("events") and set(back.column("rank").to_pylist()) == {0, 1}
    assert back.equals(p.table("events"))


def test_the_manifest_json_is_what_json_writes_of_it_all():
    """to_json writes the steps by a template: the text must stay json's, whatever the other
    keys hold (a `"steps": []` inside them, non-ASCII, newlines) and for non-int step fields."""
    steps = tuple(Step(i, i % 3, (-1) ** i * 2**62 + i, i * 10**9) for i in range(500))
    odd = {"name": 'Ñ\n  "steps": [],\n', "steps": []}
    manifests = [
        Manifest("kineto", 5),
        Manifest("kineto", 5, steps=steps[:1]),
        Manifest(
            "capture",
            -7,
            devices=(odd,),
            extra={"steps": [], "x": odd},
            steps=steps,
            inputs=("é.json",),
            row_counts={"events": 3},
        ),  # fmt: skip
        Manifest("kineto", 5, steps=(Step(True, 0, 2, 3),)),  # a bool: json's true, not 1
    ]
    for m in manifests:
        assert m.to_json() == json.dumps(dataclasses.asdict(m), indent=2, sort_keys=True)

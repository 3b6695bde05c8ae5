"""`whatif --chip` on compiled graphs (analysis/chip_swap.py, costmodel/graph_record.py): the
small GPT of samples/gpt_compile.py captured afresh on trn1, trn2 and trn3, each capture's
compiled kernels lowered again for every chip and compared, kernel for kernel, with the fresh
capture on that chip (modeled figures: deterministic)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from neuron_explorer.analysis.chip_swap import chip_change
from neuron_explorer.analysis.depgraph import build_graph
from neuron_explorer.analysis.whatif import whatif
from neuron_explorer.errors import BadInputError
from neuron_explorer.model import combine
from neuron_explorer.model.profile import Profile

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONPATH": str(ROOT)}
CHIPS = ("trn1", "trn2", "trn3", "trn2-lnc2")  # the last: trn2's logical core of two


def _chip_env(chip: str) -> dict:
    """NEURON_DEVICE_SPEC, and NEURON_LOGICAL_NC_CONFIG for a logical core ("trn2-lnc2")."""
    name, _, lnc = chip.partition("-lnc")
    return {**ENV, "NEURON_DEVICE_SPEC": name, "NEURON_LOGICAL_NC_CONFIG": lnc or "1"}


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_explorer", *args], capture_output=True,
                          text=True, timeout=600, env=env or ENV, cwd=ROOT)  # fmt: skip


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, Profile]:
    """One recorded step of the compiled GPT (no recompile in it) on each chip."""
    out = tmp_path_factory.mktemp("chip-swap")
    found = {}
    for chip in CHIPS:
        path = out / f"gpt_compile_{chip}"
        proc = _cli("capture", "-o", str(path), "--wait", "1", "--warmup", "1", "--active", "1",
                    "--", "python", "samples/gpt_compile.py", "--steps", "3", "--switch-at", "9",
                    env=_chip_env(chip))  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        found[chip] = Profile.open(path)
    return found


def _device_nodes(profile: Profile):
    graph = build_graph(profile)
    nodes = [n for n in graph.nodes if not n.host and n.kind == "device"]
    return graph, sorted(nodes, key=lambda n: n.event_id)  # launch order


@pytest.mark.parametrize("captured", CHIPS)
@pytest.mark.parametrize("chip", CHIPS)
def test_compiled_kernels_lowered_again_match_a_fresh_capture(captures, captured, chip):
    graph, mine = _device_nodes(captures[captured])
    _, fresh = _device_nodes(captures[chip])
    assert [n.name for n in mine] == [n.name for n in fresh]  # the same program, kernel by kernel
    change = chip_change(graph, captures[captured], chip)
    compiled = [(n, f) for n, f in zip(mine, fresh, strict=True) if n.neff is not None]
    assert len(compiled) > 50
    assert [change.durations.get(n.event_id) for n, _ in compiled] == [
        f.dur_ns for _, f in compiled
    ]
    if chip != captured:  # the chips differ on these kernels, so the check above can fail
        assert sum(n.dur_ns != f.dur_ns for n, f in compiled) > len(compiled) // 2
    (what,) = [c for c in whatif(captures[captured], chip=chip).changes if "lowered for" in c]
    assert f"{len(compiled)} of them compiled graphs' fused groups" in what
    assert "kept" not in what


def test_the_graphs_table_names_every_compiled_kernels_graph_once(captures):
    profile = captures["trn2"]
    graphs = profile.optional_table("graphs")
    assert graphs is not None
    keys = graphs.column("graph").cast(pa.string()).to_pylist()
    rows = (
        profile.duckdb()
        .execute("SELECT args FROM events WHERE kind = 'kernel' AND op_name LIKE 'neuron_graph%'")
        .fetchall()
    )
    named = {json.loads(a)["neff_graph"] for (a,) in rows}
    assert named == set(keys)  # every graph a kernel names is kept, and nothing else
    for key in named:  # each graph once: its ops numbered 0, 1, 2, ...
        index = [
            i for k, i in zip(keys, graphs.column("op_index").to_pylist(), strict=True) if k == key
        ]
        assert index == list(range(len(index)))
    assert (profile.path / "graphs.parquet").stat().st_size < 64 << 10  # small beside events


def test_a_profile_captured_before_graphs_were_kept_says_which_kernels_it_kept(captures, tmp_path):
    old = tmp_path / "before"
    shutil.copytree(captures["trn2"].path, old)
    (old / "graphs.parquet").unlink()
    swap = whatif(Profile.open(old), chip="trn3")
    (what,) = [c for c in swap.changes if "lowered for trn3" in c]
    _, nodes = _device_nodes(captures["trn2"])
    kept = sum(n.neff is not None for n in nodes)
    assert f", {kept} kept at their trn2 time" in what and "compiled graphs'" not in what


def test_a_malformed_graph_is_one_line_naming_the_table(captures, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(captures["trn2"].path, bad)
    table = pq.read_table(bad / "graphs.parquet")
    sources = table.column("sources").to_pylist()
    sources[0] = "[[5, 0]]"  # the first op reading a later op's output
    i = table.schema.get_field_index("sources")
    pq.write_table(table.set_column(i, "sources", pa.array(sources)), bad / "graphs.parquet")
    with pytest.raises(BadInputError, match="graphs.parquet.*sources do not fit"):
        whatif(Profile.open(bad), chip="trn3")
    proc = _cli("whatif", str(bad), "--chip", "trn3")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "graphs.parquet" in proc.stderr


def test_ranks_assembled_into_one_profile_keep_each_graph_once(captures, tmp_path):
    job = tmp_path / "job"
    for rank in (0, 1):
        shutil.copytree(captures["trn2"].path, combine.part_path(job, rank))
    combine.assemble(job, 2, "test")
    profile = Profile.open(job)
    keys = profile.optional_table("graphs").column("graph").cast(pa.string()).to_pylist()
    one = captures["trn2"].optional_table("graphs").column("graph").cast(pa.string()).to_pylist()
    assert sorted(keys) == sorted(one)
    (what,) = [c for c in whatif(profile, chip="trn3").changes if "lowered for" in c]
    assert "kept" not in what and "compiled graphs' fused groups" in what


def test_a_graph_holding_an_op_declared_elsewhere_keeps_its_kernels(captures, tmp_path):
    """A kernel declared with register_kernel exists in the capturing process only: lowered
    here its op would be priced as an elementwise op, so its graph's kernels keep their time."""
    custom = tmp_path / "custom"
    shutil.copytree(captures["trn2"].path, custom)
    table = pq.read_table(custom / "graphs.parquet")
    ops = table.column("op").cast(pa.string()).to_pylist()
    i = next(k for k, op in enumerate(ops) if op == "aten::mm")
    ops[i] = "mylib::fast_mm"
    at = table.schema.get_field_index("op")
    pq.write_table(table.set_column(at, "op", pa.array(ops).dictionary_encode()),
                   custom / "graphs.parquet")  # fmt: skip
    graph_of = table.column("graph").cast(pa.string()).to_pylist()[i]
    rows = (
        Profile.open(custom)
        .duckdb()
        .execute(
            "SELECT args FROM events WHERE kind = 'kernel' AND op_name LIKE 'neuron_graph%' AND step = 2"
        )
        .fetchall()
    )
    held = sum(json.loads(a)["neff_graph"] == graph_of for (a,) in rows)
    assert held > 0  # the renamed op's graph has kernels in the recorded step
    swap = whatif(Profile.open(custom), chip="trn3")
    (what,) = [c for c in swap.changes if "lowered for" in c]
    assert (
        f", {held} compiled kernels kept at their trn2 time" in what and "register_kernel" in what
    )
    assert f"{len(rows) - held} of them compiled graphs' fused groups" in what

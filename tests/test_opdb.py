"""Op conformance on PyTorch's op_db: neuron versus CPU, every sample bitwise equal (issue 11).

The default run checks a fast subset (the ops models use most) in one worker subprocess; the
whole op_db runs behind `-m sweep` (or `python tests/opdb_conformance.py --all`), in chunks of
subprocesses so a crash ends one op, not the run. docs/device.md ("Op conformance") has the
measured pass rates and every op that differs, with the reason.
"""

from __future__ import annotations

from pathlib import Path

import opdb_conformance as oc
import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs" / "device.md"
# ops models use most, forward and backward, in float32, bfloat16 and complex64
FAST_OPS = [
    "add", "sub", "mul", "div.no_rounding_mode", "matmul", "mm", "bmm", "addmm",
    "nn.functional.linear", "softmax", "log_softmax", "nn.functional.gelu",
    "nn.functional.silu", "nn.functional.relu", "nn.functional.layer_norm", "sum", "mean", "exp",
    "tanh", "sigmoid", "cat", "stack", "index_select", "gather", "where", "transpose", "reshape",
    "view", "nn.functional.embedding", "nn.functional.cross_entropy", "cumsum", "abs", "neg",
    "conj_physical", "fft.rfft", "fft.irfft", "nn.functional.dropout", "topk", "tensor_split",
]  # fmt: skip


def _not_equal(records: list[dict]) -> list[str]:
    bad = oc.summarize(records)["failing"]
    return [f"{b['op']} [{b['dtype']}] {b['status']} {b['off']} {b['failures'][:1]}" for b in bad]


@pytest.mark.slow  # one worker process: op_db's import and ~40 ops in 3 dtypes
def test_fast_subset_equal_to_cpu():
    records = oc.sweep(FAST_OPS, list(oc.DTYPES), chunk=len(FAST_OPS), max_samples=None)
    assert [r for r in records if r.get("status")] == []  # no crash, timeout or dead worker
    assert {r["op"] for r in records} == set(FAST_OPS)
    rates = oc.summarize(records)["rates"]
    assert rates["float32 fwd"]["samples"] > 300 and rates["complex64 bwd"]["samples"] > 50
    # bitwise equal; bf16 matmul-class ops within bf16 tolerance (fp32 accumulation, documented)
    failing = oc.summarize(records)["failing"]
    bf16_mm_close = [
        b for b in failing
        if b["dtype"] == "bfloat16" and oc.DOCUMENTED.get(b["op"]) == oc._BF16_MM
        and all(k.endswith(" close") for k in b["off"])
    ]  # fmt: skip
    assert [b for b in failing if b not in bf16_mm_close] == []


@pytest.mark.sweep  # two worker processes: ~4 s quiet (default suite < 15 min)
def test_a_crash_in_an_op_is_recorded_and_the_sweep_goes_on(monkeypatch):
    # a worker that dies in its first op (exit 3 from inside the op) is recorded as a crash of
    # that op, and the ops after it still run, in a new worker
    monkeypatch.setenv("OPDB_CRASH_IN", "abs")
    records = oc.sweep(["abs", "neg"], ["float32"], chunk=2, max_samples=2)
    by_op = {r["op"]: r for r in records}
    assert by_op["abs"]["status"] == "crashed (exit 3)"
    assert by_op["neg"]["counts"]["fwd"].get("equal", 0) >= 1 and _not_equal([by_op["neg"]]) == []


# autograd formulas that torch branches on `isTensorSubclassLike`: on the wrapper device they
# took the subclass branch and rounded differently; and renorm's, in float64 on the CPU: now
# the CPU's own (runtime/grad_formulas.py)
CPU_FORMULA_OPS = ["prod", "cumprod", "masked_fill", "masked.prod", "renorm"]


@pytest.mark.slow  # one worker process: op_db's import, then ~130 samples of each op, 3 dtypes
def test_ops_with_the_cpus_autograd_formulas_equal_the_cpu_on_every_sample():
    records = oc.sweep(CPU_FORMULA_OPS, list(oc.DTYPES), chunk=len(CPU_FORMULA_OPS),
                       max_samples=None)  # fmt: skip
    assert [r for r in records if r.get("status")] == []
    assert {r["op"] for r in records} == set(CPU_FORMULA_OPS)
    rates = oc.summarize(records)["rates"]
    assert all(rates[f"{dt} bwd"]["samples"] > 100 for dt in oc.DTYPES)
    assert _not_equal(records) == []  # bitwise, forward and backward


def test_documented_differences_are_in_the_docs():
    text = DOCS.read_text()
    missing = [op for op in (*oc.DOCUMENTED, *oc.UNEXPLAINED) if f"`{op}`" not in text]
    assert missing == []


@pytest.mark.sweep
@pytest.mark.timeout(3000)  # every op, sample and dtype: ~20-30 min on CI's 2 cores (300 s default)
def test_whole_op_db_equal_apart_from_documented(tmp_path):
    with open(tmp_path / "opdb.jsonl", "w") as out:
        records = oc.sweep(oc.all_op_ids(), list(oc.DTYPES), chunk=25, max_samples=None, out=out)
    undocumented = [
        line
        for line, b in zip(_not_equal(records), oc.summarize(records)["failing"], strict=True)
        if b["op"] not in oc.DOCUMENTED and b["op"] not in oc.UNEXPLAINED
    ]
    assert undocumented == []

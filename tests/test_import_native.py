"""The native range scanner (importers/kineto_scan.cpp) gives the same profile as msgspec's
decode, byte for byte, on every trace in tests/data and on traces with the odd JSON it refuses;
it is built where a compiler is, NEURON_EXPLORER_NATIVE=0 turns it off, and a bad trace is the
same one line either way."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA
from test_import_streaming import BIG, TRACES

from neuron_explorer.cli import main
from neuron_explorer.importers import import_traces, kineto_native
from neuron_explorer.importers.kineto_ranges import WRAP_KEY

SMALL_BUDGET = 1 << 20  # 4 KB ranges: every trace here is cut into many, most of them middles
FILES = ("events.parquet", "stacks.parquet", "counters.parquet", "manifest.json")
UNIX_US = 1_700_000_000_000_000
GPT2 = DATA / "kineto-cpu-stacks" / "gpt2_cpu_stacks_modules.pt.trace.json.gz"


@pytest.fixture
def use_native(monkeypatch):
    """Set whether the scanner is used (the loaded library is forgotten, then found again)."""

    def use(on: bool) -> bool:
        monkeypatch.setenv(kineto_native.ENV, "1" if on else "0")
        monkeypatch.setattr(kineto_native, "_lib", None)
        return kineto_native.available()

    yield use
    monkeypatch.setattr(kineto_native, "_lib", None)


def _both_ways(trace: Path, tmp_path: Path, use_native, **options) -> tuple[Path, Path]:
    scanned = use_native(True)
    if shutil.which("g++"):
        assert scanned, "g++ is here: the scanner should have been built"
    a = import_traces([trace], tmp_path / "native", **options)
    assert not use_native(False)
    b = import_traces([trace], tmp_path / "msgspec", **options)
    return a, b


def _same_files(a: Path, b: Path) -> None:
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize(
    "trace",
    [pytest.param(t, marks=pytest.mark.sweep) if t.stat().st_size > BIG else t for t in TRACES],
    ids=lambda p: p.name[:40],
)
def test_native_and_msgspec_write_the_same_profile(trace, tmp_path, use_native):
    _same_files(*_both_ways(trace, tmp_path, use_native, memory_budget=SMALL_BUDGET))


def test_the_chunked_import_is_the_same_both_ways(tmp_path, use_native):
    a, b = _both_ways(GPT2, tmp_path, use_native, memory_budget=SMALL_BUDGET, chunk_budget=16_000)
    _same_files(a, b)


def test_without_a_compiler_the_import_falls_back(tmp_path, monkeypatch, use_native):
    """A failed build (here: no compiler, an empty cache) leaves msgspec to decode, the same."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert not use_native(True)
    assert not list((tmp_path / "cache").rglob("*.so"))
    a = import_traces([GPT2], tmp_path / "a", memory_budget=SMALL_BUDGET)
    use_native(False)
    _same_files(a, import_traces([GPT2], tmp_path / "b", memory_budget=SMALL_BUDGET))


def _scan(events_text: bytes):
    """The scanner's reading of a middle range holding `events_text`."""
    text = b'{"' + WRAP_KEY.encode() + b'":[' + events_text + b"]}"
    return kineto_native.scan(memoryview(bytearray(text)), WRAP_KEY.encode())


ODD = [  # what the scanner leaves to msgspec
    b'{"ph":"X","ph":"B"}',  # a field given twice
    '{"name":"\u00e9t\u00e9"}'.encode(),  # text beyond ASCII
    b'{"ts":1.5e3}',  # an exponent
    b'{"pid":1.5}',  # a float where an int or a string goes
    b'{"name":null}',  # null where a string goes
    b'{"args":' + b"[" * 70 + b"]" * 70 + b"}",  # nested deeper than it reads
    b'{"ts":"12"}',  # a time as a string
    b'{"name":"a\\ud800"}',  # half a surrogate pair
    b'{"p\\u0068":"X"}',  # an escaped key
    b'{"pid":123456789012345678901}',  # beyond int64
    b"[1]",  # not an object
]


ODD_FORMS = [  # an event in a form msgspec reads: the scanner refuses all but the last
    lambda e: '{"ph": "i", ' + json.dumps(e)[1:],  # a field twice: the last one holds
    lambda e: json.dumps({**e, "name": e.get("name", "") + " \u00e9"}, ensure_ascii=False),
    lambda e: re.sub(r'"ts": (-?[0-9.]+)', r'"ts": \1e0', json.dumps(e), count=1),  # exponent
    lambda e: json.dumps(
        {**e, "args": {**e.get("args", {}), "deep": json.loads("[" * 70 + "]" * 70)}}
    ),
    lambda e: json.dumps(e).replace('"ph": ', '"p\\u0068": ', 1),
    # not refused: an exponent where msgspec skips the value (args), beyond float64 too
    lambda e: json.dumps({**e, "args": {**e.get("args", {}), "tiny": 2.5e-7, "huge": 1}}).replace(
        '"huge": 1', '"huge": 1e400'
    ),
]


def test_the_scanner_reads_plain_events_and_refuses_the_odd(use_native):
    if not use_native(True):
        pytest.skip("no C++ compiler here")
    plain = b'{"ph":"X","name":"a\\"b","pid":7,"tid":"t","ts":1.5,"args":{"x":[1,{}],"y":1e400}},{}'
    got = _scan(plain)
    assert got is not None and got.n == 2
    assert [got.values(i) for i in range(6)] == [
        ["X", ""],
        ['a"b', ""],
        [""],
        [7, 0],
        ["t", 0],
        [None],
    ]
    assert got.us[0].tolist() == [1.5, 0.0] and got.missing[0].tolist() == [False, True]
    assert got.args_list(np.arange(2)) == [b'{"x":[1,{}],"y":1e400}', b"null"]
    for odd in ODD:
        assert _scan(odd) is None, odd
        assert _scan(b"{}," + odd + b",{}") is None, odd


def test_odd_events_and_long_times_import_the_same_both_ways(tmp_path, use_native):
    """Events the scanner refuses, and times past 2**43 us that take their digits from the
    text, spread over the middle ranges of a plain trace."""
    doc = json.loads(gzip.decompress(GPT2.read_bytes()))
    events = doc["traceEvents"]
    lines = [json.dumps(e) for e in events]
    for i, line in enumerate(lines):  # unix times in us (1.7e15): float64 loses their ns
        lines[i] = re.sub(r'"ts": (-?[0-9.]+)', _unix_time, line, count=1)
    for i, odd in zip(range(120, len(lines), 450), ODD_FORMS, strict=False):
        lines[i] = odd(dict(events[i]))
    head = json.dumps({k: v for k, v in doc.items() if k != "traceEvents"})[:-1]
    path = tmp_path / "odd.json"
    path.write_text(head + ', "traceEvents": [\n' + ",\n".join(lines) + "\n]}")
    a, b = _both_ways(path, tmp_path, use_native, memory_budget=SMALL_BUDGET)
    _same_files(a, b)


def _unix_time(m: re.Match) -> str:
    return f'"ts": {Decimal(m.group(1)) + UNIX_US + Decimal("0.0001")}'


@pytest.mark.parametrize("on", [True, False])
def test_a_garbled_trace_is_the_same_line_both_ways(tmp_path, capsys, use_native, on):
    text = gzip.decompress(GPT2.read_bytes())
    at = len(text) // 2
    path = tmp_path / "t.json"
    path.write_bytes(text[:at] + b'}}]"{,:' * 3 + text[at:])
    use_native(on)
    assert main(["import", str(path), "-o", str(tmp_path / "p"), "--memory-budget", "1M"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"neuron-explorer: error: {path}: "), err
    use_native(not on)
    assert main(["import", str(path), "-o", str(tmp_path / "p"), "--memory-budget", "1M"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == err


def test_imports_in_threads_at_once_are_the_same(tmp_path, use_native):
    """Each thread scans into arrays of its own (a web server may import in threads)."""
    use_native(True)
    with ThreadPoolExecutor(2) as pool:
        done = list(
            pool.map(
                lambda k: import_traces([GPT2], tmp_path / f"t{k}", memory_budget=SMALL_BUDGET),
                range(2),
            )
        )
    use_native(False)
    alone = import_traces([GPT2], tmp_path / "alone", memory_budget=SMALL_BUDGET)
    for profile in done:
        _same_files(profile, alone)


def test_ids_as_text_are_strs_text_whatever_the_values():
    """Distinct pids, tids and flow ids are written as text by Arrow when all are int64s (a
    tenth of the time of str): the same strings as str of each, and str's for the rest."""
    import pyarrow as pa

    from neuron_explorer.importers.kineto_decode import as_text

    odd = [[], [1, 2], [True, 1], [2**64, 1], [2**63 - 1, -(2**63), 0], [1, "a"], [1.5], [None, 1]]
    for values in odd:
        assert as_text(values).equals(pa.array([str(v) for v in values], pa.string()))


PLAIN_ARGS = [  # args the scanner reads itself, for the op, launch/kernel and memory structs
    b"",  # no args
    b"{}",
    b'{"flops":12,"Input Dims":[[2,3],[]],"Input type":["float","c10::Half"],"x":{"flops":"y"}}',
    b'{ "correlation" : -7 , "bytes" : null , "Total Allocated" : 0 }',
    b'{"Total Reserved":999999999999999999,"Device Type":-0,"Device Id":1,"Bytes":-42}',
    b'{"Input Dims":"a\\"b\\u00e9","Input type":null,"flops":null,"correlation":3}',
    b'{"z":[1,{"bytes":1.5}],"bytes":8,"Input Dims":{"k":[true,false,null]}}',
    b'{ "Input Dims" : [ 1 , "]\\"}" ] , "Input type" : 5 , "x" : -1.5e3 , "flops" : 3 }',
    b'{"Input type":true,"Input Dims":"","q":[{}],"flops":-0}',
]
ODD_ARGS = [  # args msgspec judges: the scanner leaves the whole subset to it
    b'{"flops":"12","correlation":"12","Bytes":"12"}',  # a number as a string
    b'{"flops":1.5,"correlation":1.0,"Bytes":2.5}',
    b'{"flops":1e3,"correlation":1e3,"Bytes":1e3}',
    b'{"flops":true,"correlation":false,"Bytes":true}',
    b'{"flops":1234567890123456789,"correlation":9999999999999999999,"Bytes":-99999999999999999999}',
    b'{"flops":1,"flops":2,"correlation":1,"correlation":null,"Bytes":1,"Bytes":2}',
    b'{"Input Dims":1,"Input Dims":[2],"Input type":3,"Input type":4}',
    b'{"fl\\u006fps":5,"c\\u006frrelation":5,"Byt\\u0065s":5}',  # escaped keys
    b'{"flops":[1],"correlation":{},"Bytes":"x"}',
    b"null",
    b"[1,2]",
    b'"text"',
]


@pytest.mark.parametrize("odd", [None, *ODD_ARGS])
def test_the_typed_args_read_natively_are_msgspecs_columns(use_native, odd):
    """Each struct's columns from the scanner equal msgspec's decode and kineto_args' columns
    of the same args, and a subset with an odd args object is left to msgspec whole."""
    from neuron_explorer.importers.kineto_args import NATIVE_FIELDS, SUBSETS, typed_lines

    if not use_native(True):
        pytest.skip("no C++ compiler here")
    args = [*PLAIN_ARGS, *PLAIN_ARGS[::-1]] + ([odd] if odd is not None else [])
    events = [b'{"ph":"X","name":"a"' + (b',"args":' + a if a else b"") + b"}" for a in args]
    sc = _scan(b",".join(events))
    assert sc is not None and sc.n == len(args)
    structs = {s: f for s, f in SUBSETS.values()}
    refused: set[type] = set()
    for struct, fields in NATIVE_FIELDS.items():
        for idx in (np.arange(sc.n), np.arange(sc.n)[::3], np.arange(0)):
            got = sc.args_fields(idx, fields)
            want = typed_lines(
                sc.args_lines(idx), len(idx), lambda i=idx: sc.args_list(i), struct, structs[struct]
            )
            if got is None:  # only for a subset with the odd args, not for every struct
                assert odd is not None and sc.n - 1 in idx, struct
                refused.add(struct)
                continue
            assert len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                assert g.type == w.type and g.equals(w), (struct, g, w)
    assert bool(refused) == (odd is not None), "each odd args object is odd to some struct"

"""Chrome trace-event JSON, loadable in Perfetto and chrome://tracing, written batch by batch
from the Arrow dataset: spans are X events, instants i, flows s/f pairs, counters C, and
processes and threads are named by metadata. Times are microseconds whose decimals keep the
nanoseconds exactly ("ts": 1234.567)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ExplorerError
from ..model import Profile
from ..vocab.engines import lane_order, natural_key
from . import BATCH_ROWS, Progress, expected_rows, read_batches
from ._arrowjson import (
    LineWriter,
    Sink,
    as_text,
    choose,
    field,
    finite_text,
    int_text,
    join,
    quoted,
    raw_json,
    us_text,
)
from ._flows import FlowCollector

NAME = "perfetto"
HELP = "Chrome trace-event JSON for Perfetto and chrome://tracing (.json, or .json.gz)"
DEFAULT_SUFFIX = ".perfetto.json.gz"
# Measured on an exported trace: level 3 compresses 2.5x faster than zlib's default 6 (and 10x
# faster than 9) for a file about a fifth larger; exports are written often and read once.
GZIP_LEVEL = 3

_INT_ARGS = ("step", "parent_id", "flow_id", "stack_id", "src_line", "model_line", "flops",
             "bytes_read", "bytes_written")  # fmt: skip
_STR_ARGS = ("op_name", "src_file", "src_func", "module", "model_file", "model_func")
_RAW_ARGS = ("shapes", "dtypes", "args")  # JSON text columns, nested as JSON
_EVENT_COLUMNS = ("id", "rank", "layer", "kind", "name", "track", "device", "start_ns", "dur_ns",
                  *_INT_ARGS, *_STR_ARGS, *_RAW_ARGS)  # fmt: skip
_COUNTER_COLUMNS = ("rank", "track", "name", "ts_ns", "value", "unit")
_SEP = "\x1f"  # joins lane key parts; the track goes last, so it may hold one
_LAYER_ORDER = {"host": 0, "device": 1}
# Perfetto takes a tid equal to a pid for that process's main thread; numbering threads from
# here keeps the two apart for up to a million processes.
_FIRST_TID = 1_000_001


def check_output(out: Path) -> None:
    if not out.name.endswith((".json", ".json.gz")):
        raise ExplorerError(f"{out}: a perfetto export is named .json or .json.gz")


def write(profile: Profile, tmp: Path, progress: Progress) -> dict[str, int]:
    """Write the whole trace to `tmp`; returns counts of spans (X), instants (i), flows (s/f
    pairs), counter samples (C) and metadata events (M)."""
    progress.start(expected_rows(profile, "events", "counters"))
    counts: dict[str, int] = {}
    lanes = _Lanes()
    flows = FlowCollector()
    with _open(tmp) as fh:
        fh.write(_header(profile))
        out = LineWriter(fh)
        for batch in read_batches(profile, "events", list(_EVENT_COLUMNS)):
            out.write(_event_lines(batch, lanes, flows))
            n_instant = pc.sum(pc.equal(batch.column("dur_ns"), 0)).as_py() or 0
            _add(counts, "spans", batch.num_rows - n_instant)
            _add(counts, "instants", n_instant)
            progress.advance(batch.num_rows)
        for starts, finishes in _flow_lines(flows):
            out.write(starts)
            out.write(finishes)
            _add(counts, "flows", len(starts))
        for batch in read_batches(profile, "counters", list(_COUNTER_COLUMNS)):
            finite = batch.filter(pc.is_finite(batch.column("value")))
            out.write(_counter_lines(finite, lanes))
            _add(counts, "counter samples", finite.num_rows)
            _add(counts, "non-finite counter samples skipped", batch.num_rows - finite.num_rows)
            progress.advance(batch.num_rows)
        meta = lanes.metadata()
        out.write_text(meta)
        _add(counts, "metadata", len(meta))
        fh.write(b"\n]}\n")
    return {k: v for k, v in counts.items() if v}


def _add(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n


@contextmanager
def _open(path: Path) -> Iterator[Sink]:
    with open(path, "wb") as raw:
        if path.name.endswith(".gz"):
            # no file name or time in the gzip header: the same profile gives the same bytes
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=GZIP_LEVEL,
                               mtime=0) as gz:  # fmt: skip
                yield gz
        else:
            yield raw


def _header(profile: Profile) -> bytes:
    m = profile.manifest
    other = {
        "profile": profile.name,
        "source": m.source,
        "producer": m.producer,
        "origin_unix_ns": m.origin_unix_ns,
        "schema_version": m.schema_version,
        "ranks": list(m.ranks),
    }
    head = json.dumps({"displayTimeUnit": "ns", "otherData": other})
    return (head[:-1] + ',"traceEvents":[').encode()


def _event_lines(b: pa.RecordBatch, lanes: _Lanes, flows: FlowCollector) -> pa.Array:
    pid, tid = lanes.threads(b.column("rank"), b.column("layer"), b.column("device"),
                             b.column("track"))  # fmt: skip
    flows.add(b, pid, tid)
    instant = pc.equal(b.column("dur_ns"), 0)
    dur = pc.if_else(instant, "", join(',"dur":', us_text(b.column("dur_ns"))))
    return join(
        choose(instant, ',\n{"ph":"i","s":"t"', ',\n{"ph":"X"'),
        ',"cat":', quoted(b.column("kind")),
        ',"name":', quoted(b.column("name")),
        ',"pid":', pid, ',"tid":', tid,
        ',"ts":', us_text(b.column("start_ns")), dur,
        ',"args":{"id":', int_text(b.column("id")),
        *[field(c, int_text(b.column(c))) for c in _INT_ARGS],
        *[field(c, quoted(b.column(c))) for c in _STR_ARGS],
        *[field(c, raw_json(b.column(c))) for c in _RAW_ARGS],
        "}}",
    )  # fmt: skip


def _flow_lines(flows: FlowCollector) -> Iterator[tuple[pa.Array, pa.Array]]:
    """s/f lines for every linked pair, identified by the target event's id, so a launch that
    fans out to several device events keeps every link."""
    for p in flows.pairs(BATCH_ROWS):
        ids = int_text(pa.array(p.id))
        starts = join(
            ',\n{"ph":"s","id":', ids, ',"cat":"flow","name":"flow","pid":',
            int_text(pa.array(p.src_pid)), ',"tid":', int_text(pa.array(p.src_tid)),
            ',"ts":', us_text(pa.array(p.src_start_ns)), "}",
        )  # fmt: skip
        finishes = join(
            ',\n{"ph":"f","bp":"e","id":', ids, ',"cat":"flow","name":"flow","pid":',
            int_text(pa.array(p.dst_pid)), ',"tid":', int_text(pa.array(p.dst_tid)),
            ',"ts":', us_text(pa.array(p.dst_start_ns)), "}",
        )  # fmt: skip
        yield starts, finishes


def _counter_lines(b: pa.RecordBatch, lanes: _Lanes) -> pa.Array:
    # Perfetto names a counter track "<name> <arg key>": the unit makes it "memory_allocated bytes"
    key = pc.fill_null(quoted(b.column("unit")), '"value"')
    return join(
        ',\n{"ph":"C","name":', quoted(b.column("name")),
        ',"pid":', lanes.counter_processes(b.column("rank"), b.column("track")),
        ',"ts":', us_text(b.column("ts_ns")),
        ',"args":{', key, ":", finite_text(b.column("value")), "}}",
    )  # fmt: skip


class _Lanes:
    """Chrome pid/tid numbers: a process per (rank, layer, device), a thread per track in it,
    numbered as met; the names and sort order are written as metadata at the end."""

    def __init__(self) -> None:
        self.procs: dict[tuple[int, str, str], int] = {}  # (rank, layer, device) -> pid
        self.threads_of: dict[tuple[int, str], int] = {}  # (pid, track) -> tid
        self._maps = {"thread": _KeyMap(width=2), "counter": _KeyMap(width=1)}

    def _pid(self, rank: int, layer: str, device: str) -> int:
        return self.procs.setdefault((rank, layer, device), len(self.procs) + 1)

    def threads(self, rank: pa.Array, layer: pa.Array, device: pa.Array, track: pa.Array):
        """(pid text, tid text) arrays for each event's lane."""
        key = join(int_text(rank), _SEP, as_text(layer), _SEP,
                   pc.fill_null(as_text(device), ""), _SEP, as_text(track))  # fmt: skip

        def new(k: str) -> tuple[str, str]:
            r, lay, dev, trk = k.split(_SEP, 3)
            pid = self._pid(int(r), lay, dev)
            tid = self.threads_of.setdefault((pid, trk), _FIRST_TID + len(self.threads_of))
            return str(pid), str(tid)

        return self._maps["thread"].lookup(key, new)

    def counter_processes(self, rank: pa.Array, track: pa.Array) -> pa.Array:
        """A counter goes in the process of the device it measures, else in one of its own."""
        key = join(int_text(rank), _SEP, as_text(track))

        def new(k: str) -> tuple[str]:
            r, trk = k.split(_SEP, 1)
            rank_ = int(r)
            for (pr, _layer, dev), pid in self.procs.items():
                if pr == rank_ and dev == trk:
                    return (str(pid),)
            return (str(self._pid(rank_, "counters", trk)),)

        return self._maps["counter"].lookup(key, new)[0]

    def metadata(self) -> list[str]:
        lines = []
        order = sorted(
            self.procs, key=lambda k: (k[0], _LAYER_ORDER.get(k[1], 2), natural_key(k[2]))
        )
        for i, (rank, layer, device) in enumerate(order):
            pid = self.procs[(rank, layer, device)]
            label = f"rank {rank} {layer}" + (f" {device}" if device else "")
            lines.append(_meta("process_name", pid, None, {"name": label}))
            lines.append(_meta("process_sort_index", pid, None, {"sort_index": i}))
        tracks = sorted(self.threads_of, key=lambda k: (k[0], lane_order(k[1])))  # vocab/engines.py
        for i, (pid, track) in enumerate(tracks):
            tid = self.threads_of[(pid, track)]
            lines.append(_meta("thread_name", pid, tid, {"name": track}))
            lines.append(_meta("thread_sort_index", pid, tid, {"sort_index": i}))
        return lines


def _meta(name: str, pid: int, tid: int | None, args: dict) -> str:
    event = {"ph": "M", "name": name, "pid": pid, **({"tid": tid} if tid else {}), "args": args}
    return ",\n" + json.dumps(event)


class _KeyMap:
    """Maps string keys to tuples of text columns, vectorised with index_in; a key not yet
    seen gets its values from `new` (there are few distinct lanes, many events)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.values: dict[str, tuple[str, ...]] = {}
        self._arrays: tuple[pa.Array, list[pa.Array]] | None = None

    def lookup(self, key: pa.Array, new) -> list[pa.Array]:
        for k in pc.unique(key).to_pylist():
            if k not in self.values:
                self.values[k] = new(k)
                self._arrays = None
        if self._arrays is None:
            columns = [
                pa.array([v[i] for v in self.values.values()], pa.string())
                for i in range(self.width)
            ]
            self._arrays = (pa.array(list(self.values), pa.string()), columns)
        keys, columns = self._arrays
        idx = pc.index_in(key, value_set=keys)
        return [col.take(idx) for col in columns]

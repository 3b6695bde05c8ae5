"""The profile format, declared once: tables, columns, Arrow types, units and meanings.

Units live in column names (`_ns` is integer nanoseconds since the profile's origin). The
schema version is written into manifest.json and into every Parquet file's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from ..vocab.kinds import EVENT_KINDS, kinds_doc
from ..vocab.kinds import LAYERS as LAYERS

FORMAT = "neuron-explorer-profile"
SCHEMA_VERSION = 2
# Columns added since version 1 (all nullable): a version-1 file without them reads as nulls.
ADDED_IN = {"events": {"module": 2, "model_file": 2, "model_line": 2, "model_func": 2},
            "stacks": {"scope": 2}}  # fmt: skip

# The event kinds and layers are the vocabulary's (vocab/kinds.py); named here for the schema.
KINDS = EVENT_KINDS

_DICT = pa.dictionary(pa.int32(), pa.string())


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    unit: str
    doc: str
    nullable: bool = True

    def field(self) -> pa.Field:
        return pa.field(self.name, self.type, nullable=self.nullable)


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]

    @property
    def file(self) -> str:
        return f"{self.name}.parquet"

    def arrow_schema(self) -> pa.Schema:
        meta = {b"neuron_explorer.schema_version": str(SCHEMA_VERSION).encode()}
        return pa.schema([c.field() for c in self.columns], metadata=meta)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)


EVENTS = Table(
    "events",
    "Every span and instant of the run, host and device, sorted by (rank, start_ns).",
    (
        Column("id", pa.int64(), "", "Unique event id within the profile.", nullable=False),
        Column("rank", pa.int32(), "", "Distributed rank that recorded the event (0 for one process).", nullable=False),
        Column("layer", _DICT, "", "host (the Python process) or device (the accelerator).", nullable=False),
        Column("kind", _DICT, "", "What the event is: " + kinds_doc() + ".", nullable=False),
        Column("name", _DICT, "", "Event name as recorded (aten op, kernel name, function).", nullable=False),
        Column("track", _DICT, "", "The lane the event sits on: a thread, an engine, a DMA queue, a CUDA stream.", nullable=False),
        Column("device", _DICT, "", "Device the event ran on, e.g. cpu, neuron:0, cuda:0."),
        Column("start_ns", pa.int64(), "ns", "Start time in nanoseconds since the profile's origin.", nullable=False),
        Column("dur_ns", pa.int64(), "ns", "Duration in nanoseconds; 0 for instants.", nullable=False),
        Column("parent_id", pa.int64(), "", "Id of the enclosing event on the same track, if any."),
        Column("flow_id", pa.int64(), "", "Links a host launch to the device work it caused (and backward ops to forward ops)."),
        Column("step", pa.int32(), "", "Training step (ProfilerStep#N) the event falls in, if any."),
        Column("stack_id", pa.int64(), "", "Python call stack of the event, a key into stacks."),
        Column("src_file", _DICT, "", "Innermost user source file (outside torch and site-packages)."),
        Column("src_line", pa.int32(), "", "Line in src_file."),
        Column("src_func", _DICT, "", "Function in src_file."),
        Column("op_name", _DICT, "", "Framework operator the event belongs to (itself for ops, the launching op for device work)."),
        Column("shapes", pa.string(), "", "Input shapes as JSON text, e.g. [[8, 16], [16]]."),
        Column("dtypes", pa.string(), "", "Input dtypes as JSON text, e.g. [\"float\", \"float\"]."),
        Column("flops", pa.int64(), "FLOP", "Floating point operations performed."),
        Column("bytes_read", pa.int64(), "bytes", "Bytes read from memory (HBM for device work)."),
        Column("bytes_written", pa.int64(), "bytes", "Bytes written to memory."),
        Column("args", pa.string(), "", "JSON object of all other attributes, kept so nothing is dropped."),
        Column("module", _DICT, "", "nn.Module path of the innermost module whose forward was running, as model.named_modules() names it (transformer.h.0.attn.c_attn; the empty string is the model itself); backward work inherits its forward's."),
        Column("model_file", _DICT, "", "Innermost model-code frame: outside torch, the standard library and neuron_explorer (a library's modeling file, or the user's own model)."),
        Column("model_line", pa.int32(), "", "Line in model_file."),
        Column("model_func", _DICT, "", "Function in model_file."),
    ),
)  # fmt: skip

STACKS = Table(
    "stacks",
    "Python call stacks; one row per frame.",
    (
        Column("stack_id", pa.int64(), "", "Stack key, referenced by events.stack_id.", nullable=False),
        Column("depth", pa.int32(), "", "Frame depth, 0 = innermost.", nullable=False),
        Column("file", _DICT, "", "Source file of the frame.", nullable=False),
        Column("line", pa.int32(), "", "Line number in file."),
        Column("function", _DICT, "", "Function name of the frame."),
        Column("scope", _DICT, "", "Whose code the frame is, decided by its file's path: user, library (site-packages), torch or stdlib."),
    ),
)  # fmt: skip

COUNTERS = Table(
    "counters",
    "Sampled values over time: memory, bandwidth, utilization.",
    (
        Column("rank", pa.int32(), "", "Rank that recorded the sample.", nullable=False),
        Column("track", _DICT, "", "Counter lane, e.g. the device.", nullable=False),
        Column("name", _DICT, "", "Counter name, e.g. memory_allocated.", nullable=False),
        Column("ts_ns", pa.int64(), "ns", "Sample time in nanoseconds since the profile's origin.", nullable=False),
        Column("value", pa.float64(), "", "Sample value, in unit.", nullable=False),
        Column("unit", _DICT, "", "Unit of value: bytes, bytes/s, percent, count."),
    ),
)  # fmt: skip

GRAPHS = Table(
    "graphs",
    "The graphs a capture's compiled programs (NEFFs) were lowered from, one row per aten op, so "
    "that their kernels can be lowered again for another chip (`whatif --chip`).",
    (
        Column("graph", _DICT, "", "The graph's key, a hash of its rows; a compiled kernel's args.neff_graph names it.", nullable=False),
        Column("op_index", pa.int32(), "", "The op's place in the graph (topological order, as the FX graph lists it).", nullable=False),
        Column("op", _DICT, "", "The aten op, e.g. aten::mm.", nullable=False),
        Column("inputs", pa.string(), "", "Its input tensors as JSON: [[shape, dtype], ...], [shape, dtype, 1] for one stored transposed.", nullable=False),
        Column("outputs", pa.string(), "", "Its output tensors, written as inputs are.", nullable=False),
        Column("sources", pa.string(), "", "Where each input comes from as JSON: [op_index, output] (graph input k is [-1 - k, 0]), null when unknown.", nullable=False),
        Column("exported", pa.string(), "", "Whether the graph returns each output, as JSON 0/1.", nullable=False),
    ),
)  # fmt: skip

TABLES: dict[str, Table] = {t.name: t for t in (EVENTS, STACKS, COUNTERS)}
# Tables a profile may lack (written only when there is something to keep; older profiles have
# none): a missing one reads as empty.
OPTIONAL_TABLES: dict[str, Table] = {t.name: t for t in (GRAPHS,)}
# Every table a reader may ask for by name: SQL, the web's tables and the CSV export see these.
ALL_TABLES: dict[str, Table] = {**TABLES, **OPTIONAL_TABLES}


def empty_table(table: Table) -> pa.Table:
    return table.arrow_schema().empty_table()


def conform(table: Table, data: pa.Table | dict) -> pa.Table:
    """Cast columns to the declared schema, adding missing nullable columns as nulls."""
    if isinstance(data, dict):
        n = max((len(v) for v in data.values()), default=0)
        cols = data
    else:
        n = data.num_rows
        cols = {name: data.column(name) for name in data.column_names}
    unknown = set(cols) - {c.name for c in table.columns}
    if unknown:
        raise ValueError(f"{table.name}: unknown columns {sorted(unknown)}")
    arrays = []
    for col in table.columns:
        if col.name in cols:
            arr = cols[col.name]
            if not isinstance(arr, (pa.Array, pa.ChunkedArray)):
                value_type = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
                arr = pa.array(arr, type=value_type)
            arrays.append(arr.cast(col.type) if arr.type != col.type else arr)
        elif col.nullable:
            arrays.append(pa.nulls(n, type=col.type))
        else:
            raise ValueError(f"{table.name}: required column {col.name} missing")
    return pa.Table.from_arrays(arrays, schema=table.arrow_schema())

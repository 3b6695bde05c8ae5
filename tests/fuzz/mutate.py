"""Mutations of real torch.profiler traces, the inputs of the importer fuzzers.

Each mutation is a small function `(trace bytes or parsed JSON, rng) -> bytes` named by what it
breaks; `mutate(seed_bytes, kind, rng)` applies one. Everything is seeded, so a failing input is
reproduced from (trace, kind, seed).
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHARED_KINETO = ROOT / "tests" / "data" / "kineto-gpu"
SAMPLE_TRACES = ROOT / "samples" / "traces"
MAX_SEED_BYTES = 64 * 1024  # the small real traces: an import takes well under 0.1 s

WRONG_VALUES: tuple[Any, ...] = (
    None, True, "x", "", "12", [], [1, 2], {}, {"a": 1}, -1, 0, 1.5, float("nan"),
    float("inf"), -float("inf"), 2**63, -(2**63) - 1, 10**30, 1e308, -1e308,
)  # fmt: skip
UNICODE_NAMES = (
    "αβγ∑", "名前::op", "\u202eevil", "\ud800", "\x00nul", "e\u0301", "😀" * 50, "<script>x</script>",
    "a\nb", "'; DROP TABLE events; --", "%s%n", "\\u0000",
)  # fmt: skip


def seed_traces() -> list[Path]:
    """The real traces small enough to fuzz quickly (shared Kineto traces and the sample)."""
    found = sorted(SHARED_KINETO.glob("*.json.gz")) + sorted(SAMPLE_TRACES.glob("*.json.gz"))
    return [p for p in found if p.stat().st_size <= MAX_SEED_BYTES]


def load(path: Path) -> bytes:
    """The uncompressed JSON text of a trace file."""
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def _events(doc: Any) -> list[Any]:
    ev = doc.get("traceEvents") if isinstance(doc, dict) else None
    return ev if isinstance(ev, list) and ev else []


def _pick_event(doc: Any, rng: random.Random) -> dict | None:
    events = [e for e in _events(doc) if isinstance(e, dict)]
    return rng.choice(events) if events else None


def _dump(doc: Any, rng: random.Random) -> bytes:
    return json.dumps(doc, ensure_ascii=rng.random() < 0.5, allow_nan=True).encode(
        "utf-8", "surrogatepass"
    )


# ---- byte-level ------------------------------------------------------------------------------
def truncate(raw: bytes, rng: random.Random) -> bytes:
    return raw[: rng.randrange(len(raw))]


def bit_flip(raw: bytes, rng: random.Random) -> bytes:
    buf = bytearray(raw)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    return bytes(buf)


def gzip_truncated(raw: bytes, rng: random.Random) -> bytes:
    packed = gzip.compress(raw)
    return packed[: rng.randrange(1, len(packed))]


def gzip_bit_flip(raw: bytes, rng: random.Random) -> bytes:
    return bit_flip(gzip.compress(raw), rng)


def splice_garbage(raw: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(raw))
    junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return raw[:i] + junk + raw[i:]


# ---- structure-level (parsed JSON) -------------------------------------------------------------
def remove_field(doc: Any, rng: random.Random) -> Any:
    for _ in range(rng.randint(1, 20)):
        ev = _pick_event(doc, rng)
        if ev:
            ev.pop(rng.choice(sorted(ev)), None)
    return doc


def wrong_type(doc: Any, rng: random.Random) -> Any:
    for _ in range(rng.randint(1, 20)):
        ev = _pick_event(doc, rng)
        if ev:
            ev[rng.choice(sorted(ev))] = rng.choice(WRONG_VALUES)
    return doc


def huge_numbers(doc: Any, rng: random.Random) -> Any:
    for _ in range(rng.randint(1, 20)):
        ev = _pick_event(doc, rng)
        if ev:
            key = rng.choice(["ts", "dur", "pid", "tid", "id"] + [k for k in ev if k != "args"])
            ev[key] = rng.choice([2**64, -(2**64), 10**40, 1e300, -1e300, 2**53 + 1, 9e18])
    return doc


def negative_durations(doc: Any, rng: random.Random) -> Any:
    for ev in _events(doc):
        if isinstance(ev, dict) and "dur" in ev and rng.random() < 0.3:
            ev["dur"] = -abs(ev["dur"]) if isinstance(ev["dur"], (int, float)) else -1
    return doc


def unicode_names(doc: Any, rng: random.Random) -> Any:
    for ev in _events(doc):
        if isinstance(ev, dict) and rng.random() < 0.3:
            ev[rng.choice(["name", "cat", "tid", "pid"])] = rng.choice(UNICODE_NAMES)
    return doc


def deep_args(raw: bytes, rng: random.Random) -> bytes:
    """An event's args nested thousands deep (written as text: json.dumps itself would recurse)."""
    doc = json.loads(raw)
    ev = _pick_event(doc, rng)
    if ev is None:
        return raw
    ev["args"] = {"deep": "@@DEEP@@"}
    depth = rng.choice([50, 500, 5000, 50_000])
    opener, closer = (b'{"a":', b"}") if rng.random() < 0.5 else (b"[", b"]")
    nested = opener * depth + b"1" + closer * depth
    return _dump(doc, rng).replace(b'"@@DEEP@@"', nested, 1)


def top_level(doc: Any, rng: random.Random) -> Any:
    if isinstance(doc, dict):
        key = rng.choice(sorted(doc) or ["traceEvents"])
        doc[key] = rng.choice(WRONG_VALUES)
    return doc


def shuffle_and_duplicate(doc: Any, rng: random.Random) -> Any:
    events = _events(doc)
    if events:
        events += rng.sample(events, min(len(events), 50))
        rng.shuffle(events)
    return doc


BYTE_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    f.__name__: f
    for f in (truncate, bit_flip, gzip_truncated, gzip_bit_flip, splice_garbage, deep_args)
}
JSON_MUTATIONS: dict[str, Callable[[Any, random.Random], Any]] = {
    f.__name__: f
    for f in (remove_field, wrong_type, huge_numbers, negative_durations, unicode_names,
              top_level, shuffle_and_duplicate)
}  # fmt: skip
KINDS = tuple(BYTE_MUTATIONS) + tuple(JSON_MUTATIONS)


def mutate(raw: bytes, kind: str, rng: random.Random) -> bytes:
    """`raw` (a trace's JSON text) with one mutation of the given kind applied."""
    if kind in BYTE_MUTATIONS:
        return BYTE_MUTATIONS[kind](raw, rng) if raw else raw
    doc = json.loads(raw)
    return _dump(JSON_MUTATIONS[kind](doc, rng), rng)
